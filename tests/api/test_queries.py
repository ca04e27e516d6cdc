"""The number of SQL queries per page does not grow with the number of runs or attempts (10 vs 1,000 runs)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from durableruns.models import Escalation, RunState, RunStep
from tests.api.conftest import bulk_runs

pytestmark = pytest.mark.django_db(transaction=True)

PAGES = [
    "/api/runs/",
    "/api/runs/?workflow=scripted&status=needs_decision",
    "/api/runs/?effect_key=bulk-00003:third",
    "/api/runs/bulk-00003/",
    "/api/escalations/",
    "/api/escalations/?state=all",
]


def queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, response.content
    return len(captured)


def captured_for(client, url: str) -> list[dict[str, str]]:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return list(captured.captured_queries)


def test_queries_do_not_grow_with_runs(client_for, reader):
    client = client_for(reader)
    bulk_runs(10, escalate=True)
    small = {url: queries(client, url) for url in PAGES}

    bulk_runs(990, start=10, escalate=True)
    assert RunState.objects.count() == 1000 and Escalation.objects.count() == 1000
    large = {url: queries(client, url) for url in PAGES}

    assert large == small
    # token lookup + the user's permissions (own, groups') + page + the attempts and the attributes of the page's
    # runs: no COUNT
    assert small["/api/runs/"] == 6
    # token lookup + permissions (2) + page (escalation, run, decision joined) + the attempts of their runs
    assert small["/api/escalations/"] == 5
    assert not any("COUNT(" in q["sql"].upper() for q in captured_for(client, "/api/runs/"))
    # and the pages really are full: 50 rows rendered from those few queries
    assert len(client.get("/api/escalations/").json()["results"]) == 50


def test_a_run_page_does_not_grow_with_its_attempts(client_for, reader):
    client = client_for(reader)
    [run_id] = bulk_runs(1, escalate=True)
    few = queries(client, f"/api/runs/{run_id}/")
    now = RunStep.objects.filter(run_id=run_id).first().started_at
    RunStep.objects.bulk_create(
        RunStep(run_id=run_id, step="first", attempt=n, status="failed", started_at=now, error="refused")
        for n in range(2, 302)
    )
    many = queries(client, f"/api/runs/{run_id}/")
    # token, permissions (2), run, attempts, escalations with decisions, interventions, events, attributes,
    # children (its parent only when it has one)
    assert many == few == 10
    assert len(client.get(f"/api/runs/{run_id}/").json()["attempts"]) == 303
