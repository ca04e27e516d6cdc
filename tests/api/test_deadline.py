"""POST /api/runs/ with deadline_seconds (issue 32): the run records its deadline from the database's clock, the
run's representation shows it, and a bad value is a clear 400 that records nothing."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from durableruns.models import RunState

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_started_with_deadline_seconds_records_it_and_shows_it(client_for, starter):
    response = client_for(starter).post(
        "/api/runs/", {"workflow": "scripted", "input": {}, "run_id": "timed", "deadline_seconds": 3600}, format="json"
    )
    assert response.status_code == 201, response.content
    run = RunState.objects.get(pk="timed")
    assert run.deadline_at - run.created_at == timedelta(hours=1) and run.on_deadline == "cancel"
    body = response.json()
    assert body["deadline_at"] is not None
    assert f"deadline {run.deadline_at:%Y-%m-%d %H:%M} UTC" in body["sentence"]
    listed = client_for(starter).get("/api/runs/").json()["results"]
    assert [r["deadline_at"] for r in listed if r["run_id"] == "timed"] == [body["deadline_at"]]


def test_without_deadline_seconds_there_is_none(client_for, starter):
    response = client_for(starter).post("/api/runs/", {"workflow": "scripted", "input": {}}, format="json")
    assert response.status_code == 201 and response.json()["deadline_at"] is None


@pytest.mark.parametrize(
    ("seconds", "says"),
    [
        (0, "greater than or equal to 1"),
        (-5, "greater than or equal to 1"),
        ("soon", "A valid integer is required"),
        (10**12, "less than or equal to"),
        (1.5, "A valid integer is required"),
    ],
)
def test_a_bad_deadline_seconds_is_a_400_and_records_nothing(client_for, starter, seconds, says):
    response = client_for(starter).post(
        "/api/runs/",
        {"workflow": "scripted", "input": {}, "run_id": "refused", "deadline_seconds": seconds},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert says in json.dumps(response.json())
    assert not RunState.objects.filter(pk="refused").exists()
