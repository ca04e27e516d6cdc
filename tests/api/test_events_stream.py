"""GET /api/runs/{run_id}/events-stream/ over real HTTP (Django's live server): server-sent events derived from
the record, with ordered ids, resumable with Last-Event-ID, going on across a SIGKILLed worker and the one that
takes the run over, ending with the run; and the run detail's own authentication, permissions and scope."""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

import pytest
import requests
from rest_framework.authtoken.models import Token

import tests.progress_workflows  # noqa: F401  (registers the workflows in this process)
from durableruns import services
from durableruns.models import RunState, RunStatus
from durableruns.timeline import parse_id
from tests.api.conftest import READ, user_with
from tests.conftest import wait_until
from tests.factories import make_run
from tests.progress_workflows import MODULES

pytestmark = pytest.mark.django_db(transaction=True)

ENV = {"DURABLERUNS_WORKFLOW_MODULES": MODULES, "DURABLERUNS_RETRY_BACKOFF_SECONDS": "0"}

Event = dict[str, Any]


def read_stream(url: str, token: str, last_event_id: str | None = None, timeout: float = 60) -> list[Event]:
    """Every event of one stream, until the server ends it."""
    headers = {"Authorization": f"Token {token}", "Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    events: list[Event] = []
    with requests.get(url, headers=headers, stream=True, timeout=timeout) as response:
        assert response.status_code == 200, response.text
        assert response.headers["Content-Type"].startswith("text/event-stream")
        current: Event = {}
        for line in response.iter_lines(decode_unicode=True):
            if line == "":
                if "id" in current:
                    events.append(current)
                current = {}
            elif line.startswith("id: "):
                current["id"] = line[4:]
            elif line.startswith("event: "):
                current["event"] = line[7:]
            elif line.startswith("data: "):
                current["data"] = json.loads(line[6:])
    return events


def token_of(user) -> str:
    return Token.objects.create(user=user).key


def kinds(events: list[Event]) -> list[tuple[str, str, int]]:
    return [(e["event"], e["data"].get("step", ""), e["data"].get("attempt", 0)) for e in events]


@pytest.mark.postgres
def test_the_stream_goes_on_across_a_sigkilled_worker_and_resumes_with_last_event_id(live_server, workers, tmp_path):
    run_id = make_run("progress_crawl")
    token = token_of(user_with("reader", *READ))
    url = f"{live_server.url}/api/runs/{run_id}/events-stream/"
    seen: list[Event] = []
    reader = threading.Thread(target=lambda: seen.extend(read_stream(url, token)), daemon=True)
    reader.start()
    mark = tmp_path / "at-crawl-2"
    doomed = workers.start("--lease", "1", "--worker", "doomed", TEST_PROGRESS_MARK=str(mark), **ENV)
    wait_until(mark.exists, what="the first attempt to reach its second report")
    time.sleep(0.8)  # the stream's next read sees the first attempt's report
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=10)
    time.sleep(1.2)  # its lease runs out
    taker = workers.run("--lease", "30", "--worker", "taker", **ENV)
    assert taker.returncode == 0, taker.stderr
    reader.join(timeout=30)
    assert not reader.is_alive(), "the stream did not end with the run"
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED

    keys = [parse_id(e["id"]) for e in seen]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)  # ordered, each once
    said = kinds(seen)
    assert said[0] == ("started", "crawl", 1)
    assert ("progress", "crawl", 1) in said  # what the killed worker reported before it died
    assert said.index(("started", "crawl", 2)) > said.index(("progress", "crawl", 1))
    assert ("completed", "crawl", 2) in said and ("completed", "wrap_up", 1) in said
    assert said[-1][0] == "end" and seen[-1]["data"]["status"] == "completed"
    last_report = [e for e in seen if e["event"] == "progress" and e["data"]["attempt"] == 2][-1]["data"]
    assert (last_report["message"], last_report["done"], last_report["total"]) == ("crawled 5 (attempt 2)", 5, 5)

    # Reconnecting after the new attempt's start: the events after it only, with the same ids.
    resume_at = next(e["id"] for e in seen if kinds([e])[0] == ("started", "crawl", 2))
    again = read_stream(url, token, last_event_id=resume_at)
    assert again and all(parse_id(e["id"]) > parse_id(resume_at) for e in again)
    after = [e for e in seen if parse_id(e["id"]) > parse_id(resume_at)]
    # Transitions are the same events; progress is the record's latest per attempt, which the live stream saw too.
    assert [e for e in again if e["event"] != "progress"] == [e for e in after if e["event"] != "progress"]
    assert {e["id"] for e in again} <= {e["id"] for e in seen}
    assert again[-1]["event"] == "end"
    # Resumed after its end: nothing more, and the stream ends at once.
    assert read_stream(url, token, last_event_id=seen[-1]["id"]) == []


def test_the_stream_of_an_ended_run_replays_its_events_then_ends(live_server):
    run_id = services.start_run("scripted", {"script": {}})
    services.resume_due()
    token = token_of(user_with("reader", *READ))
    events = read_stream(f"{live_server.url}/api/runs/{run_id}/events-stream/", token)
    assert kinds(events)[-1][0] == "end"
    assert ("completed", "first", 1) in kinds(events)
    assert read_stream(f"{live_server.url}/api/runs/{run_id}/events-stream/", token) == events  # stable ids


def test_the_stream_has_the_run_details_authentication_permissions_and_scope(client_for, settings, anonymous):
    settings.DURABLERUNS_WORKFLOW_GROUPS = {"scripted": ["Payroll"]}
    scoped = make_run("scripted")
    open_run = make_run("progressing")
    reader = user_with("reader", *READ)
    stream = "/api/runs/{}/events-stream/"
    assert anonymous.get(stream.format(open_run)).status_code == 401
    assert client_for(user_with("outsider")).get(stream.format(open_run)).status_code == 403
    assert client_for(reader).get(stream.format(scoped)).status_code == 404  # out of scope: not there
    assert client_for(reader).get(stream.format("no-such-run")).status_code == 404
    refused = client_for(reader).get(
        stream.format(open_run), HTTP_LAST_EVENT_ID="not an id", HTTP_ACCEPT="text/event-stream"
    )
    assert refused.status_code == 400 and b"Last-Event-ID" in refused.content
