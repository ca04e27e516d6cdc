"""POST /api/runs/ with "debounce_seconds" and "key" (issue 35): a debounced start through the API."""

from __future__ import annotations

import json

import pytest

from durableruns.models import RunState, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)


def test_debounced_starts_answer_the_same_run_with_the_last_input(client_for, starter):
    client = client_for(starter)
    ids = []
    for edit in range(3):
        response = client.post(
            "/api/runs/",
            {"workflow": "requote", "input": {"edit": edit}, "debounce_seconds": 30, "key": "order-17"},
            format="json",
        )
        assert response.status_code == 201, response.content
        ids.append(response.json()["run_id"])
    assert len(set(ids)) == 1
    run = RunState.objects.get(pk=ids[0])
    assert run.input == {"edit": 2} and run.status == RunStatus.WAITING and run.debounce_key == "order-17"
    assert "debounced until" in client.get(f"/api/runs/{ids[0]}/").json()["sentence"]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"debounce_seconds": 30}, "debounce_seconds and key go together"),
        ({"key": "order-17"}, "debounce_seconds and key go together"),
        ({"debounce_seconds": 0, "key": "k"}, "greater than or equal to 0.001"),
        ({"debounce_seconds": "soon", "key": "k"}, "A valid number is required"),
        ({"debounce_seconds": 30, "key": "a\nb"}, "control character"),
        ({"debounce_seconds": 30, "key": "x" * 201}, "no more than 200 characters"),
    ],
)
def test_a_bad_debounce_is_a_400_and_records_nothing(client_for, starter, extra, says):
    response = client_for(starter).post("/api/runs/", {"workflow": "requote", "input": {}, **extra}, format="json")
    assert response.status_code == 400
    assert says in json.dumps(response.json())
    assert not RunState.objects.exists()
