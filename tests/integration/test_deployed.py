"""What deployments bring, worked in-process on the real database: crashes that are not failures, odd answers,
data the database refuses, and absence counted from the last moment a process was alive."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

import durableruns
from durableruns import Rejected, registry, services
from durableruns.clock import Clock
from durableruns.models import Intervention, RunState, RunStatus, RunStep
from tests.factories import complete, crash_after_intent, declare_unchecked, make_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_backoff(settings):
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0


def attempts(run_id: str, step: str) -> list[tuple[int, str]]:
    return list(RunStep.objects.filter(run_id=run_id, step=step).order_by("attempt").values_list("attempt", "status"))


def run(run_id: str) -> RunState:
    return RunState.objects.get(pk=run_id)


# Declared once at import, each under a name of this module's own.
calls: dict[str, int] = {}

slow_caller = durableruns.Workflow("deployed_slow_caller")


def _never_found(ctx: Any) -> None:
    return None


@slow_caller.step(policy="resolvable", lookup=_never_found, timeout=timedelta(seconds=1), lookup_lag=timedelta(0))
def reads_then_calls(ctx: Any) -> dict[str, Any]:
    """Reads for longer than its timeout before its far call, which then times out (outcome unknown)."""
    calls[ctx.run_id] = calls.get(ctx.run_id, 0) + 1
    time.sleep(float(ctx.input.get("reading", 1.5)))
    raise TimeoutError("the far system did not answer")


def test_absence_counts_from_the_moment_the_step_raised_not_from_its_start():
    run_id = make_run("deployed_slow_caller", {"reading": 1.5})
    services.resume_due(lease_seconds=3)
    # started + timeout (1 s) had passed when it raised, but the call may have left just before: no second call
    assert calls[run_id] == 1 and attempts(run_id, "reads_then_calls") == [(1, "started")]
    state = run(run_id)
    raised_at = Clock().now() - timedelta(seconds=0.5)  # generous: the pass ended moments ago
    assert state.status == RunStatus.WAITING and state.wake_at >= raised_at + timedelta(seconds=1) - timedelta(
        seconds=0.5)
    row = RunStep.objects.get(run_id=run_id)
    assert state.wake_at - row.started_at >= timedelta(seconds=1.5 + 1), (row.started_at, state.wake_at)
    # The moment it raised is recorded, and is the bound: not the lease its worker went on renewing meanwhile.
    assert row.raised_at is not None and state.wake_at == row.raised_at + timedelta(seconds=1)
    assert row.held_until > row.raised_at
    # A later pass bounds the call by the recorded raise too: 2 s on, absence is provable (by the lease it
    # would not be yet), so it runs the step again under the same key.
    services.resume_due(lease_seconds=3, clock=Clock(shift=timedelta(seconds=2)))
    assert calls[run_id] == 2 and attempts(run_id, "reads_then_calls")[:2] == [(1, "started"), (2, "started")]


def test_absence_counts_from_the_lease_a_crashed_attempt_last_held():
    """A renewal proves the worker alive at the renewal, not silent after it: until the lease it then took ran
    out, a lost worker may still have made its call."""
    run_id = make_run(input={"lookup": None})
    complete(run_id, "first", {})
    crash_after_intent(run_id, "second", cursor=1, started_at=Clock().now() - timedelta(minutes=5))
    renewed = Clock().now() - timedelta(seconds=20)  # its heartbeat renewed a 30 s lease 20 s ago
    RunStep.objects.filter(run_id=run_id, step="second").update(renewed_at=renewed,
                                                                 held_until=renewed + timedelta(seconds=30))
    services.resume_due()  # renewal + 30 s timeout + 60 s lag would be 70 s away; the held lease adds 30 more
    state = run(run_id)
    assert state.status == RunStatus.WAITING and attempts(run_id, "second") == [(1, "started")]
    assert state.wake_at == renewed + timedelta(seconds=30 + 30 + 60)


def test_an_attempt_recorded_before_held_until_counts_from_its_last_renewal_plus_the_lease():
    run_id = make_run(input={"lookup": None})
    complete(run_id, "first", {})
    crash_after_intent(run_id, "second", cursor=1, started_at=Clock().now() - timedelta(minutes=5))
    renewed = Clock().now() - timedelta(seconds=2)  # its heartbeat kept it alive until moments ago
    RunStep.objects.filter(run_id=run_id, step="second").update(renewed_at=renewed, held_until=None)
    services.resume_due()  # started + 30 s lease + 30 s timeout + 60 s lag is long past; from the renewal, not
    state = run(run_id)
    assert state.status == RunStatus.WAITING and attempts(run_id, "second") == [(1, "started")]
    assert state.wake_at == renewed + timedelta(seconds=30 + 30 + 60)  # lease (the setting) + timeout + lag


beating = durableruns.Workflow("deployed_beating")


@beating.step(policy="re_executable")
def long_read(ctx: Any) -> dict[str, Any]:
    time.sleep(1.0)
    row = RunStep.objects.get(run_id=ctx.run_id, step="long_read", attempt=ctx.attempt)
    return {"renewed": row.renewed_at is not None and row.renewed_at > row.started_at,
            "held": row.held_until is not None and row.held_until >= row.renewed_at + timedelta(seconds=0.3)}


def test_the_heartbeat_records_the_attempt_in_hand_alive():
    run_id = make_run("deployed_beating")
    services.resume_due(lease_seconds=0.3)
    assert RunStep.objects.get(run_id=run_id, step="long_read").result == {"renewed": True, "held": True}


# -- a crash is not a failure ------------------------------------------------------------------------------


def test_a_step_killed_more_times_than_its_attempts_runs_again_not_failed():
    run_id = make_run()
    for attempt in (1, 2, 3):  # three workers died inside `first`, each leaving its attempt started
        crash_after_intent(run_id, "first", attempt=attempt)
    services.resume_due()
    assert attempts(run_id, "first") == [(1, "started"), (2, "started"), (3, "started"), (4, "completed")]
    assert run(run_id).status == RunStatus.COMPLETED  # nothing failed


def test_the_crash_budget_stops_the_run_for_staff_and_a_retry_gives_a_fresh_count(settings, django_user_model):
    settings.DURABLERUNS_MAX_CRASHES = 3
    run_id = make_run()
    for attempt in (1, 2, 3):
        crash_after_intent(run_id, "first", attempt=attempt)
    services.resume_due()
    state = run(run_id)
    assert state.status == RunStatus.NEEDS_DECISION, state.reason
    assert "first" in state.reason and "3 times" in state.reason and "crash budget of 3" in state.reason
    assert attempts(run_id, "first") == [(1, "started"), (2, "started"), (3, "started")]  # not run a 4th time
    services.retry_run(run_id, by="ops", note="the worker host was being replaced")
    retry = Intervention.objects.get(run_id=run_id, action="retry")
    assert (retry.step, retry.attempt) == ("first", 3)
    services.resume_due()
    assert attempts(run_id, "first")[-1] == (4, "completed")


def test_observed_failures_still_count_against_max_attempts_not_crashes():
    run_id = make_run(input={"first": "reject"})
    crash_after_intent(run_id, "first", attempt=1)  # one crash, then three rejections
    services.resume_due()
    assert attempts(run_id, "first") == [(1, "started"), (2, "failed"), (3, "failed"), (4, "failed")]
    assert run(run_id).status == RunStatus.FAILED and "3 of 3" in run(run_id).reason


def test_retrying_a_run_failed_with_its_latest_attempt_in_doubt_names_the_step_and_runs_it():
    run_id = make_run()
    crash_after_intent(run_id, "first", attempt=1)
    # What the previous version left: a run failed by "gave up after 3 of 3 attempts" with a started attempt.
    RunState.objects.filter(pk=run_id).update(status=RunStatus.FAILED, reason="first: gave up after 3 of 3 attempts")
    services.retry_run(run_id, by="ops", note="it was only crashes")
    assert Intervention.objects.get(run_id=run_id).step == "first"
    services.resume_due()
    assert attempts(run_id, "first") == [(1, "started"), (2, "completed")]
    assert run(run_id).status == RunStatus.COMPLETED


# -- odd answers end cleanly ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "kind"), [([], "list"), ("yes", "str"), (True, "bool"), (3, "int")])
def test_a_lookup_answer_that_is_neither_a_dict_nor_none_is_a_lookup_error(answer, kind):
    run_id = make_run(input={"lookup": answer})
    complete(run_id, "first", {})
    crash_after_intent(run_id, "second", cursor=1)
    report = services.resume_due(clock=Clock(shift=timedelta(hours=1)))
    assert report.crashed == []
    state = run(run_id)
    assert state.status == RunStatus.WAITING and "lookup raised" in state.reason and f"a {kind}" in state.reason
    assert attempts(run_id, "second") == [(1, "started")] and attempts(run_id, "third") == []


shapes = durableruns.Workflow("deployed_shapes")


@shapes.step(policy="re_executable")
def gives(ctx: Any) -> dict[Any, Any]:
    return {7: "express", "ids": (1, 2)}


@shapes.step(policy="re_executable")
def reads(ctx: Any) -> dict[str, Any]:
    seen = ctx.results["gives"]
    return {"seen": seen, "key_7_is_text": "7" in seen, "ids_is_a_list": isinstance(seen["ids"], list)}


def test_later_steps_see_results_as_recorded_in_a_live_pass_as_after_a_resume():
    live = make_run("deployed_shapes")
    services.resume_due()
    resumed = make_run("deployed_shapes")
    complete(resumed, "gives", {"7": "express", "ids": [1, 2]})
    RunState.objects.filter(pk=resumed).update(cursor=1)
    services.resume_due()
    expected = {"seen": {"7": "express", "ids": [1, 2]}, "key_7_is_text": True, "ids_is_a_list": True}
    assert RunStep.objects.get(run_id=live, step="reads").result == expected
    assert RunStep.objects.get(run_id=resumed, step="reads").result == expected


counting = durableruns.Workflow("deployed_counting")


@counting.step(policy="re_executable", max_attempts=3)
def count_items(ctx: Any) -> dict[str, Any]:
    done = ctx.progress.setdefault("done", [])
    for item in ctx.loop(list(range(20)), every=5):
        if item == 12 and ctx.attempt <= 2:  # fails twice in one pass, after checkpoints at 5 and 10
            raise ConnectionError("the price service dropped the connection")
        done.append(item)
    return {"count": len(done), "items": done}


def test_progress_restarts_from_the_last_commit_however_often_a_pass_retries():
    run_id = make_run("deployed_counting")
    services.resume_due()
    assert attempts(run_id, "count_items") == [(1, "failed"), (2, "failed"), (3, "completed")]
    assert RunStep.objects.get(run_id=run_id, step="count_items", attempt=3).result == {
        "count": 20, "items": list(range(20))}


# -- data the database refuses ends one run's turn only --------------------------------------------------------


awkward = durableruns.Workflow("deployed_awkward")


@awkward.step(policy="re_executable", max_attempts=1)
def refuses(ctx: Any) -> None:
    raise Rejected(ctx.input["why"])


def test_an_error_text_of_any_size_is_stored_cut_with_a_marker():
    huge = make_run("deployed_awkward", {"why": "x" * 200_000})
    after = make_run("scripted")
    report = services.resume_due()
    assert report.crashed == []
    assert run(huge).status == RunStatus.FAILED and len(run(huge).reason) < 20_000 and "[cut:" in run(huge).reason
    assert run(after).status == RunStatus.COMPLETED  # the pass went on to the next run


nul_reason = durableruns.Workflow("deployed_nul_reason")


@nul_reason.step(policy="re_executable", max_attempts=1)
def speaks_nul(ctx: Any) -> None:
    raise Rejected("the vendor said: \x00\x00 (binary garbage) \ud800")


def test_a_nul_character_in_an_error_is_replaced_and_the_pass_goes_on():
    bad = make_run("deployed_nul_reason")
    after = make_run("scripted")
    report = services.resume_due()
    assert report.crashed == []
    error = RunStep.objects.get(run_id=bad, step="speaks_nul").error
    assert "\x00" not in error and "\\0\\0 (binary garbage)" in error
    assert run(bad).status == RunStatus.FAILED and run(after).status == RunStatus.COMPLETED


def _short(ctx: Any) -> dict[str, Any]:
    return {}


def _long_named(ctx: Any) -> dict[str, Any]:
    return {}


_short.__name__ = "short"
_long_named.__name__ = "s" * 250  # longer than run_step.step holds: the database refuses the row


@pytest.fixture
def too_long():
    """A workflow whose second step's name is longer than the record stores. Workflow.step refuses such a name
    now (DeclarationError, and `check` says so): it stands for a deploy from before, whose runs are recorded.
    Registered for the test only, so no other test's system checks see it."""
    workflow = durableruns.Workflow("deployed_too_long")
    declare_unchecked(workflow, _short)
    declare_unchecked(workflow, _long_named)
    yield workflow
    registry._registry.pop(workflow.name, None)
    registry._declared()


@pytest.mark.postgres
def test_a_database_error_from_one_runs_data_ends_that_runs_turn_only(settings, too_long):
    settings.DURABLERUNS_INTERNAL_ERROR_BACKOFF_SECONDS = 600
    bad = make_run("deployed_too_long")
    after = make_run("scripted")
    report = services.resume_due()
    assert [run_id for run_id, _ in report.crashed] == [bad]
    state = run(bad)
    # Refused again at every try: stopped for staff with the error, not retried first in every pass
    assert state.status == RunStatus.NEEDS_DECISION and "DataError" in state.reason
    assert "value too long" in state.reason and state.wake_at is None and state.lease_expires_at is None
    assert run(after).status == RunStatus.COMPLETED  # worked in the same pass
    assert connection.connection.info.transaction_status == 0  # idle: the failed statement left nothing open


def test_a_bug_inside_durableruns_records_its_reason_and_releases_the_run_with_a_backoff(monkeypatch, settings,
                                                                                       too_long):
    settings.DURABLERUNS_INTERNAL_ERROR_BACKOFF_SECONDS = 600
    from durableruns import engine

    real = engine.compute_boundary

    def buggy(plan, attempts, **options):  # a bug in durableruns that only this run's shape reaches
        if plan == ("short", "s" * 250):
            raise RuntimeError("boundary bug")
        return real(plan, attempts, **options)

    monkeypatch.setattr(engine, "compute_boundary", buggy)
    bad = make_run("deployed_too_long")
    after = make_run("scripted")
    report = services.resume_due()
    assert report.crashed == [(bad, "RuntimeError: boundary bug")]
    state = run(bad)
    assert state.status == RunStatus.WAITING and "durableruns raised" in state.reason and "boundary bug" in state.reason
    assert state.lease_expires_at is None and state.wake_at > Clock().now() + timedelta(seconds=500)
    assert run(after).status == RunStatus.COMPLETED


def _first_long_named(ctx: Any) -> dict[str, Any]:
    return {}


_first_long_named.__name__ = "f" * 250  # its intent rides on the claim's own statement (store.claims.CLAIM)


@pytest.fixture
def first_too_long():
    """As too_long, the over-long step first: a fresh run's first intent is written by the claim itself."""
    workflow = durableruns.Workflow("deployed_first_too_long")
    declare_unchecked(workflow, _first_long_named)
    yield workflow
    registry._registry.pop(workflow.name, None)
    registry._declared()


@pytest.mark.postgres
def test_a_first_step_the_database_refuses_in_the_claim_ends_that_runs_turn_only(first_too_long):
    bad = make_run("deployed_first_too_long")
    good = make_run("scripted")
    report = services.resume_due()  # raised DataError out of the claim, every pass, before the fix
    assert [run_id for run_id, _ in report.crashed] == [bad]
    state = run(bad)
    assert state.status == RunStatus.NEEDS_DECISION and "value too long" in state.reason
    assert not RunStep.objects.filter(run_id=bad).exists()  # nothing half recorded
    assert run(good).status == RunStatus.COMPLETED
    # A later pass does not take it first again: the next run is worked, the stopped one left to staff
    later = make_run("scripted")
    again = services.resume_due()
    assert again.crashed == [] and [o.run_id for o in again.outcomes] == [later]
    assert run(later).status == RunStatus.COMPLETED and run(bad).status == RunStatus.NEEDS_DECISION
