"""Metrics: the view's text parses with prometheus_client's own parser and its numbers match the record; only
staff who may view runs, or the bearer token, get it; a worker serves its own counters on --metrics-port."""

from __future__ import annotations

import socket
import urllib.request
from datetime import timedelta

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from durableruns.clock import Clock
from durableruns.models import RunState, RunStatus, RunStep, StepStatus
from tests.admin.users import VIEW, logged_in, staff
from tests.conftest import wait_until
from tests.factories import crash_after_intent, make_run
from tests.ops.records import aged_run, escalate, stopped_by_crash_budget

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.ops.urls")]

URL = "/durableruns/metrics"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def scrape(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get(URL)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return samples(response.content.decode())


def test_the_numbers_match_the_record():
    for _ in range(3):
        aged_run(RunStatus.COMPLETED, days=2, attempts=3, cursor=3)
    aged_run(RunStatus.FAILED, days=1, attempts=1, cursor=0)
    aged_run(RunStatus.PENDING, attempts=0)
    aged_run(RunStatus.COMPLETED, workflow="order", attempts=0, cursor=4)
    # In doubt: a crashed run (lease expired) 10 minutes ago, and an escalated one 2 hours ago.
    crashed = make_run("scripted")
    crash_after_intent(crashed, "first", started_at=Clock().now() - timedelta(minutes=10))
    escalated = aged_run(RunStatus.NEEDS_DECISION, attempts=0)
    RunStep.objects.create(
        run_id=escalated,
        step="third",
        attempt=1,
        status=StepStatus.STARTED,
        effect_key="k",
        started_at=Clock().now() - timedelta(hours=2),
        owner="w",
        epoch=1,
    )
    escalate(escalated, step="third", opened_ago=timedelta(hours=1, minutes=50))
    # Not in doubt: a run held under a live lease, and a decided escalation.
    held = make_run("scripted")
    RunState.objects.filter(pk=held).update(
        status=RunStatus.RUNNING, lease_expires_at=Clock().now() + timedelta(seconds=30)
    )
    RunStep.objects.create(
        run_id=held,
        step="first",
        attempt=1,
        status=StepStatus.STARTED,
        effect_key="h",
        started_at=Clock().now() - timedelta(days=1),
        owner="w",
        epoch=1,
    )
    escalate(aged_run(RunStatus.PENDING, attempts=0), decided=True, opened_ago=timedelta(days=3))

    got = scrape(logged_in(staff("viola", *VIEW)))
    runs = {labels: value for (name, labels), value in got.items() if name == "durableruns_runs"}
    expected = {}
    for workflow, status in RunState.objects.values_list("workflow", "status"):
        key = (("status", status), ("workflow", workflow))
        expected[key] = expected.get(key, 0) + 1
    assert runs == expected
    assert runs[(("status", "completed"), ("workflow", "scripted"))] == 3
    assert runs[(("status", "pending"), ("workflow", "scripted"))] == 2
    assert runs[(("status", "running"), ("workflow", "scripted"))] == 2
    assert got[("durableruns_steps_in_doubt", (("workflow", "scripted"),))] == 2
    oldest_doubt = got[("durableruns_step_in_doubt_oldest_seconds", (("workflow", "scripted"),))]
    assert 2 * 3600 <= oldest_doubt < 2 * 3600 + 120
    assert got[("durableruns_escalations_open", (("workflow", "scripted"),))] == 1
    oldest_escalation = got[("durableruns_escalation_oldest_open_seconds", (("workflow", "scripted"),))]
    assert 110 * 60 <= oldest_escalation < 112 * 60


def test_an_empty_record_parses_with_no_samples_but_its_families_declared():
    response = logged_in(staff("viola", *VIEW)).get(URL)
    names = {family.name for family in text_string_to_metric_families(response.content.decode())}
    assert {"durableruns_runs", "durableruns_steps_in_doubt", "durableruns_escalations_open"} <= names
    assert samples(response.content.decode()) == {}


def test_only_staff_who_may_view_runs_or_the_token_get_it(settings):
    settings.DURABLERUNS_METRICS_TOKEN = "s3cret-token"
    assert Client().get(URL).status_code == 403
    assert logged_in(staff("nemo")).get(URL).status_code == 403
    assert Client().get(URL, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert Client().get(URL, headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
    assert logged_in(staff("viola", *VIEW)).get(URL).status_code == 200
    assert logged_in(staff("viola2", *VIEW)).post(URL).status_code == 405


def test_without_a_token_setting_no_bearer_gets_in(settings):
    settings.DURABLERUNS_METRICS_TOKEN = ""
    assert Client().get(URL, headers={"Authorization": "Bearer "}).status_code == 401


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_worker_serves_its_own_counters_on_its_metrics_port(workers):
    runs = [make_run("scripted") for _ in range(4)]
    failing = make_run("scripted", {"first": "reject"})
    port = _free_port()
    workers.start("--loop", "--interval", "0.2", "--metrics-port", str(port), DURABLERUNS_RETRY_BACKOFF_SECONDS="0")

    def finished() -> bool:
        return RunState.objects.filter(pk__in=[*runs, failing], status__in=["completed", "failed"]).count() == 5

    wait_until(finished, timeout=60, what="the worker to finish the runs")

    def counted() -> dict:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return samples(response.read().decode())
        except OSError:
            return {}

    wait_until(
        lambda: counted().get(("durableruns_worker_runs_total", (("status", "failed"),))) == 1,
        timeout=30,
        what="the counters to be served",
    )
    got = counted()
    assert got[("durableruns_worker_runs_total", (("status", "completed"),))] == 4
    assert got[("durableruns_worker_steps_total", ())] == 15  # 12 returned, and `first` raised 3 times
    assert got[("durableruns_worker_runs_raised_total", ())] == 0
    assert got[("durableruns_worker_attempts_failed_total", ())] == 3  # `first` refused, max_attempts=3
    assert got[("durableruns_worker_steps_in_doubt_total", ())] == 0
    # A --loop worker's pass lasts as long as the worker (its threads wait for work between runs): its duration
    # is observed when it ends, so nothing is counted yet.
    assert got[("durableruns_worker_pass_seconds_count", ())] == 0
    # Every claim is timed: one per run worked (the rejected one at least once), plus the empty claims of idle
    # threads looking for work.
    claims = got[("durableruns_worker_claim_seconds_count", ())]
    assert claims >= 5
    assert got[("durableruns_worker_claim_seconds_bucket", (("le", "+Inf"),))] == claims
    assert got[("durableruns_worker_claim_seconds_sum", ())] > 0


def test_runs_stopped_for_staff_with_no_escalation_are_counted_by_why(settings):
    from durableruns.ops.metrics import render_record

    crashed = stopped_by_crash_budget(settings)
    RunState.objects.filter(pk=crashed).update(updated_at=Clock().now() - timedelta(minutes=30))
    aged_run(
        RunStatus.NEEDS_DECISION,
        attempts=0,
        reason="stopped for staff: the database refused this run's data (DataError: value too long)",
    )
    escalated = aged_run(RunStatus.NEEDS_DECISION, attempts=0)
    escalate(escalated)  # listed by the escalation gauges, not as stopped
    found = samples(render_record().decode())
    assert found[("durableruns_runs_stopped", (("reason", "crash_budget"), ("workflow", "scripted")))] == 1
    assert found[("durableruns_runs_stopped", (("reason", "data_refused"), ("workflow", "scripted")))] == 1
    assert sum(v for (name, _), v in found.items() if name == "durableruns_runs_stopped") == 2
    oldest = found[("durableruns_run_stopped_oldest_seconds", (("workflow", "scripted"),))]
    assert 1800 <= oldest < 1900
