"""/api/runs/ and /api/runs/{run_id}/: listing with filters and pages, starting runs, reading one in full."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from durableruns import services
from durableruns.models import Escalation, Intervention, RunState, RunStatus, RunStep
from tests.api.conftest import bulk_runs, escalated_run, user_with
from tests.factories import complete, crash_after_intent, make_run

pytestmark = pytest.mark.django_db(transaction=True)


def counts() -> tuple[int, ...]:
    return (RunState.objects.count(), RunStep.objects.count(), Escalation.objects.count(), Intervention.objects.count())


# -- listing -----------------------------------------------------------------------------------------------


def test_the_list_is_newest_first_with_each_runs_sentence(client_for, reader):
    older = make_run(run_id="po-older")
    complete(older, "first", {})
    crash_after_intent(older, "second", cursor=1, started_at=timezone.localtime().replace(hour=14, minute=7))
    make_run(run_id="po-newer")
    RunState.objects.filter(pk="po-older").update(created_at=timezone.now() - timedelta(hours=1))

    response = client_for(reader).get("/api/runs/")

    assert response.status_code == 200
    body = response.json()
    assert [r["run_id"] for r in body["results"]] == ["po-newer", "po-older"]
    assert set(body) == {"next", "previous", "results"}  # a cursor page: no count over a table that grows
    item = body["results"][1]
    assert item["sentence"] == "1 step complete, second in doubt since 14:07, 2 steps remaining"
    assert (item["workflow"], item["status"], item["cursor"], item["owner"]) == (
        "scripted",
        "running",
        1,
        "dead-worker",
    )
    assert set(item) == {
        "run_id",
        "workflow",
        "status",
        "sentence",
        "attributes",
        "cursor",
        "owner",
        "lease_expires_at",
        "wake_at",
        "deadline_at",
        "reason",
        "created_at",
        "updated_at",
    }
    assert body["results"][0]["sentence"] == "0 steps complete, 3 steps remaining"


def test_filters_by_status_workflow_run_id_and_effect_key(client_for, reader, far):
    done = make_run("order", run_id="po:done")
    services.resume_due(run_id=done)
    make_run("scripted", run_id="sc-1")
    make_run("scripted", run_id="sc-2")
    client = client_for(reader)

    def ids(query: str) -> list[str]:
        response = client.get(f"/api/runs/?{query}")
        assert response.status_code == 200, response.content
        return sorted(r["run_id"] for r in response.json()["results"])

    assert ids("status=completed") == ["po:done"]
    assert ids("status=pending") == ["sc-1", "sc-2"]
    assert ids("workflow=scripted") == ["sc-1", "sc-2"]
    assert ids("run_id=sc-2") == ["sc-2"]
    assert ids("effect_key=po:done:charge") == ["po:done"]  # one row, though the run has four attempts
    assert ids("effect_key=nobody:charge") == []
    assert ids("workflow=scripted&status=completed") == []
    assert ids("status=&workflow=") == ["po:done", "sc-1", "sc-2"]  # blank filters are ignored


def test_an_unknown_status_filter_is_a_400_naming_the_parameter(client_for, reader):
    response = client_for(reader).get("/api/runs/?status=stuck")
    assert response.status_code == 400
    assert "status" in response.json() and "not a valid choice" in response.json()["status"][0]


def test_the_list_is_paginated_by_50_with_a_cursor(client_for, reader):
    ids = bulk_runs(51)  # bulk-00000 is the newest
    client = client_for(reader)
    first = client.get("/api/runs/").json()
    assert len(first["results"]) == 50 and first["previous"] is None and "count" not in first
    assert first["results"][0]["run_id"] == "bulk-00000" and "cursor=" in first["next"]
    last = client.get(first["next"]).json()
    assert [r["run_id"] for r in last["results"]] == ["bulk-00050"] and last["next"] is None
    assert {r["run_id"] for r in first["results"] + last["results"]} == set(ids)
    assert client.get("/api/runs/?cursor=not-a-cursor").status_code == 404


def test_runs_created_at_the_same_instant_are_neither_skipped_nor_repeated(client_for, reader, settings):
    settings.DURABLERUNS_API_PAGE_SIZE = 3
    ids = bulk_runs(10)
    RunState.objects.update(created_at=timezone.now())  # one timestamp: only the run_id orders them
    client = client_for(reader)
    seen: list[str] = []
    url: str | None = "/api/runs/"
    while url:
        page = client.get(url).json()
        assert len(page["results"]) <= 3
        seen += [r["run_id"] for r in page["results"]]
        url = page["next"]
    assert seen == sorted(ids, reverse=True)  # newest first, the unique run_id breaking the tie


# -- starting ----------------------------------------------------------------------------------------------


def test_starting_a_run_records_it_pending_and_answers_201_with_the_run(client_for, starter):
    response = client_for(starter).post(
        "/api/runs/", {"workflow": "scripted", "input": {"a": 1}, "run_id": "po-2026:17"}, format="json"
    )
    assert response.status_code == 201, response.content
    assert response["Location"] == "/api/runs/po-2026:17/"
    body = response.json()
    assert (body["run_id"], body["status"], body["input"]) == ("po-2026:17", "pending", {"a": 1})
    assert [p["zone"] for p in body["boundary"]["plan"]] == ["not_started"] * 3
    run = RunState.objects.get(pk="po-2026:17")
    assert (run.workflow, run.status, run.input) == ("scripted", RunStatus.PENDING, {"a": 1})


def test_a_run_id_is_generated_when_omitted(client_for, starter):
    response = client_for(starter).post("/api/runs/", {"workflow": "scripted", "input": {}}, format="json")
    assert response.status_code == 201
    run_id = response.json()["run_id"]
    assert run_id.startswith("scripted-") and RunState.objects.filter(pk=run_id).exists()


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"workflow": "no_such_flow", "input": {}}, 400, "no workflow named 'no_such_flow'"),
        ({"workflow": "scripted", "input": [1, 2]}, 400, "must be a JSON object, not list"),
        ({"workflow": "scripted", "input": "text"}, 400, "must be a JSON object, not str"),
        ({"workflow": "scripted"}, 400, "This field is required."),
        ({"input": {}}, 400, "This field is required."),
        ({"workflow": "scripted", "input": {}, "run_id": "   "}, 400, "may not be blank"),
        ({"workflow": "scripted", "input": {}, "run_id": "x" * 201}, 400, "no more than 200 characters"),
        ({"workflow": "scripted", "input": {"a": "nul\u0000"}}, 400, "NUL"),
        ([1, 2, 3], 400, "Expected a dictionary"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message_and_changes_nothing(client_for, starter, body, status, says):
    make_run(run_id="existing")
    before = counts()
    response = client_for(starter).post("/api/runs/", body, format="json")
    assert response.status_code == status
    assert says in json.dumps(response.json())
    assert counts() == before


def test_a_user_who_may_start_runs_cannot_start_the_internal_task_workflow(client_for, tmp_path):
    """The report's exact body: a user holding only start_run, naming a shell command as the task."""
    only_start = user_with("only-start", "start_run")
    body = {"workflow": "durableruns.task", "input": {"task": "subprocess.getoutput", "args": ["id"]}}
    before = counts()
    response = client_for(only_start).post("/api/runs/", body, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "unknown_workflow"
    assert "durableruns.task" not in response.json()["detail"].split("known:")[1]
    assert counts() == before
    services.resume_due()  # and the next pass has nothing of it to run
    assert not RunState.objects.filter(workflow="durableruns.task").exists()


def test_the_durableruns_errors_carry_a_code(client_for, starter):
    response = client_for(starter).post("/api/runs/", {"workflow": "nope", "input": {}}, format="json")
    assert response.json()["code"] == "unknown_workflow" and response.json()["workflow"] == "nope"
    response = client_for(starter).post("/api/runs/", {"workflow": "scripted", "input": [1]}, format="json")
    assert response.json()["code"] == "invalid_input"


def test_malformed_json_is_a_400_and_changes_nothing(client_for, starter):
    before = counts()
    response = client_for(starter).post(
        "/api/runs/", data='{"workflow": "scripted", "input": {', content_type="application/json"
    )
    assert response.status_code == 400 and "JSON parse error" in response.json()["detail"]
    assert counts() == before


@pytest.mark.parametrize(("depth", "says"), [(100_000, "nested too deeply"), (65, "nested deeper than 64")])
def test_a_body_nested_too_deeply_is_a_400_not_a_crash(client_for, starter, depth, says):
    body = '{"workflow": "scripted", "input": {"a": %s}}' % ("[" * depth + "]" * depth)
    response = client_for(starter).post("/api/runs/", data=body, content_type="application/json")
    assert response.status_code == 400 and says in response.json()["detail"]
    assert RunState.objects.count() == 0


def test_a_body_nested_within_the_limit_is_accepted(client_for, starter):
    body = '{"workflow": "scripted", "input": {"a": %s}}' % ("[" * 62 + "]" * 62)
    assert client_for(starter).post("/api/runs/", data=body, content_type="application/json").status_code == 201


def test_a_form_body_is_refused_415(client_for, starter):
    response = client_for(starter).post("/api/runs/", {"workflow": "scripted", "input": "{}"}, format="multipart")
    assert response.status_code == 415 and RunState.objects.count() == 0


def test_a_duplicate_run_id_is_a_409_and_the_first_run_is_untouched(client_for, starter):
    make_run(input={"first": "ok"}, run_id="po-1")
    before = counts()
    response = client_for(starter).post(
        "/api/runs/", {"workflow": "order", "input": {"x": 2}, "run_id": "po-1"}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["code"] == "duplicate_run" and response.json()["run_id"] == "po-1"
    assert "exists already" in response.json()["detail"]
    assert counts() == before
    run = RunState.objects.get(pk="po-1")
    assert (run.workflow, run.input) == ("scripted", {"first": "ok"})


# -- one run -----------------------------------------------------------------------------------------------


def test_a_run_in_full_shows_its_boundary_attempts_escalation_and_decision(client_for, reader, decider):
    escalation = escalated_run(run_id="po:7-a")
    services.resolve_escalation(escalation.pk, "did_not_happen", by=decider, note="outbox is empty")

    response = client_for(reader).get("/api/runs/po:7-a/")

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "pending" and body["input"] == {}
    assert body["sentence"].startswith("2 steps complete, third in doubt since ")
    plan = body["boundary"]["plan"]
    assert [(p["step"], p["zone"], p["policy"]) for p in plan] == [
        ("first", "done", "re_executable"),
        ("second", "done", "resolvable"),
        ("third", "in_doubt", "escalate"),
    ]
    assert plan[2]["since"] is not None and plan[0]["since"] is None and plan[2]["attempt"] == 1
    assert body["boundary"]["done"] == ["first", "second"] and body["boundary"]["in_doubt"] == ["third"]
    assert body["boundary"]["remainder"] == ["third"] and body["boundary"]["failed"] == []
    assert [(a["step"], a["attempt"], a["status"]) for a in body["attempts"]] == [
        ("first", 1, "completed"),
        ("second", 1, "completed"),
        ("third", 1, "started"),
    ]
    third = body["attempts"][2]
    assert third["effect_key"] == "po:7-a:third" and third["owner"] == "dead-worker" and third["epoch"] == 1
    assert set(third) >= {"started_at", "finished_at", "error", "result", "loop_cursor", "resolution"}
    [esc] = body["escalations"]
    assert (esc["id"], esc["step"], esc["doc"]) == (escalation.pk, "third", "Nobody can look this up; decide by hand.")
    assert esc["decision"]["action"] == "did_not_happen" and esc["decision"]["decided_by"] == "decider"
    [intervention] = body["interventions"]
    assert (intervention["decided_by"], intervention["note"], intervention["escalation_id"]) == (
        "decider",
        "outbox is empty",
        escalation.pk,
    )


def test_a_failed_step_shows_in_the_failed_zone(client_for, reader, settings):
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0
    run_id = make_run(input={"first": "reject"}, run_id="po-fails")
    services.resume_due(run_id=run_id)
    body = client_for(reader).get(f"/api/runs/{run_id}/").json()
    assert body["status"] == "failed" and body["boundary"]["failed"] == ["first"]
    assert body["boundary"]["plan"][0]["zone"] == "failed" and body["boundary"]["plan"][0]["attempt"] == 3
    assert "refused" in body["attempts"][-1]["error"]


def test_a_run_of_a_workflow_this_deploy_does_not_know_renders_through_its_own_plan(client_for, reader):
    make_run(run_id="ghost")
    complete("ghost", "first", {})
    RunState.objects.filter(pk="ghost").update(workflow="retired_flow")
    body = client_for(reader).get("/api/runs/ghost/").json()
    assert body["workflow"] == "retired_flow" and body["boundary"]["plan_known"] is True
    assert [(s["step"], s["zone"], s["policy"]) for s in body["boundary"]["plan"]] == [
        ("first", "done", "re_executable"),
        ("second", "not_started", "resolvable"),
        ("third", "not_started", "escalate"),
    ]


def test_a_run_whose_plan_is_not_recorded_renders_the_steps_it_attempted(client_for, reader):
    make_run(run_id="ghost")
    complete("ghost", "first", {})
    RunState.objects.filter(pk="ghost").update(workflow="retired_flow", plan_fingerprint="0123456789abcdef")
    body = client_for(reader).get("/api/runs/ghost/").json()
    assert body["boundary"]["plan_known"] is False and body["plan_fingerprint"] == "0123456789abcdef"
    assert body["boundary"]["plan"] == [{"step": "first", "zone": "done", "since": None, "attempt": 1, "policy": None}]
    assert body["sentence"] == "1 step complete, the rest unknown: the run's plan is not recorded"


def test_an_unknown_run_is_a_404_naming_it(client_for, reader):
    response = client_for(reader).get("/api/runs/no-such-run/")
    assert response.status_code == 404
    assert response.json()["code"] == "run_not_found" and response.json()["run_id"] == "no-such-run"


def test_a_run_id_with_a_slash_is_reachable(client_for, starter):
    client = client_for(starter)
    assert (
        client.post(
            "/api/runs/", {"workflow": "scripted", "input": {}, "run_id": "acme/po-1"}, format="json"
        ).status_code
        == 201
    )
    response = client.get("/api/runs/acme/po-1/")
    assert response.status_code == 200 and response.json()["run_id"] == "acme/po-1"


def test_the_detail_says_the_runs_queue_priority_and_concurrency_key(client_for, reader):
    run_id = services.start_run("keyed", {"buyer": "acme"}, priority=5, queue="bulk")
    body = client_for(reader).get(f"/api/runs/{run_id}/").json()
    assert (body["queue"], body["priority"], body["concurrency_key"]) == ("bulk", 5, "acme")
    plain = client_for(reader).get(f"/api/runs/{make_run()}/").json()
    assert (plain["queue"], plain["priority"], plain["concurrency_key"]) == ("default", 0, None)
