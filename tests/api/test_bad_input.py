"""Input the API cannot use is refused with a 4xx that says why, never a 500: a cursor whose position is no value
of the list's order, a run_id with a control character, an input a workflow's concurrency_key cannot read."""

from __future__ import annotations

import base64

import pytest

from durableruns.models import RunState
from tests.api.conftest import bulk_runs, escalated_run

pytestmark = pytest.mark.django_db(transaction=True)


def cursor(querystring: str) -> str:
    """A cursor as DRF encodes one (base64 of its query string), holding whatever position a caller made up."""
    return base64.b64encode(querystring.encode("ascii")).decode("ascii")


# Positions a caller can write but no list is ordered by: not a time, a date that does not exist, a NUL.
BAD_POSITIONS = ["p=not-a-date", "p=2026-02-30T10:00:00%2B00:00", "p=2026-01-01%00"]


@pytest.mark.parametrize("position", BAD_POSITIONS)
@pytest.mark.parametrize(
    "path", ["/api/runs/", "/api/escalations/", "/api/escalations/?state=decided", "/api/escalations/?state=all"]
)
def test_a_cursor_whose_position_is_not_a_time_is_an_invalid_cursor_not_a_500(client_for, reader, path, position):
    bulk_runs(3)
    escalated_run()
    join = "&" if "?" in path else "?"
    response = client_for(reader).get(f"{path}{join}cursor={cursor(position)}")
    assert response.status_code == 404, response.content
    assert response.json() == {"detail": "Invalid cursor"}


def test_a_well_formed_cursor_still_pages(client_for, reader, settings):
    settings.DURABLERUNS_API_PAGE_SIZE = 2
    bulk_runs(3)
    client = client_for(reader)
    first = client.get("/api/runs/").json()
    rest = client.get(first["next"]).json()
    assert [r["run_id"] for r in first["results"] + rest["results"]] == ["bulk-00000", "bulk-00001", "bulk-00002"]


@pytest.mark.parametrize(
    "run_id", ["po\n42", "po\r\nBcc: x@example.com", "po\t42", "po\x1b[31m42", "po\x7f", "po\u2028 42", "po\x85 42"]
)
def test_a_run_id_with_a_control_character_is_refused_with_a_400(client_for, starter, run_id):
    response = client_for(starter).post(
        "/api/runs/", {"workflow": "scripted", "input": {}, "run_id": run_id}, format="json"
    )
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid_input" and "control character" in body["detail"], body
    assert not RunState.objects.exists()


def test_an_input_its_concurrency_key_cannot_read_is_refused_with_a_400_and_starts_nothing(client_for, starter):
    # the "keyed" workflow's concurrency_key is lambda input: input["buyer"]
    response = client_for(starter).post("/api/runs/", {"workflow": "keyed", "input": {"seller": "s1"}}, format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid_input" and "concurrency_key" in body["detail"] and "buyer" in body["detail"], body
    assert not RunState.objects.exists()
    response = client_for(starter).post("/api/runs/", {"workflow": "keyed", "input": {"buyer": "b1"}}, format="json")
    assert response.status_code == 201, response.content
