"""A lookup that keeps raising has a budget, counted from the record, after which the run stops for staff with
its last error; and a single pass (--once) with DURABLERUNS_LOOKUP_RETRY_SECONDS=0 ends instead of spinning."""

from __future__ import annotations

import re

import pytest

from durableruns import services
from durableruns.models import RunState, RunStatus, RunStep
from tests.factories import complete, crash_after_intent, make_run

pytestmark = pytest.mark.django_db(transaction=True)


def in_doubt_whose_lookup_raises() -> str:
    """A run of `scripted` whose resolvable step `second` is in doubt and whose lookup always raises."""
    run_id = make_run(input={"lookup": "raise"})
    complete(run_id, "first", {})
    crash_after_intent(run_id, "second", cursor=1)
    return run_id


def test_a_lookup_that_always_raises_reaches_staff_after_its_budget_and_each_pass_ends(settings):
    settings.DURABLERUNS_LOOKUP_RETRY_SECONDS = 0
    settings.DURABLERUNS_MAX_LOOKUP_ERRORS = 3
    run_id = in_doubt_whose_lookup_raises()
    for errors in (1, 2):
        report = services.resume_due(max_seconds=30)  # spun until the deadline before: the wait was over at once
        assert [o.run_id for o in report.outcomes] == [run_id] and report.seconds < 20
        state = RunState.objects.get(pk=run_id)
        assert state.status == RunStatus.WAITING and f"(raised {errors} of 3 times in a row" in state.reason
    services.resume_due(max_seconds=30)  # a pass of its own counts on from the record
    state = RunState.objects.get(pk=run_id)
    assert state.status == RunStatus.NEEDS_DECISION, state.reason
    assert state.reason.startswith("the lookup of second raised 3 times in a row, its budget of 3")
    assert "TimeoutError: lookup endpoint timed out" in state.reason and f"{run_id}:second" in state.reason
    assert list(RunStep.objects.filter(run_id=run_id, step="second").values_list("status", flat=True)) == ["started"]
    assert services.resume_due().outcomes == []  # left to staff
    # A retry asks again, with a fresh count
    services.retry_run(run_id, by="ops", note="the far system is back")
    services.resume_due(max_seconds=30)
    state = RunState.objects.get(pk=run_id)
    assert state.status == RunStatus.WAITING and "(raised 1 of 3 times in a row" in state.reason


def test_a_pass_leaves_a_run_due_again_at_once_to_the_next_and_works_the_others(settings):
    settings.DURABLERUNS_LOOKUP_RETRY_SECONDS = 0
    looping = in_doubt_whose_lookup_raises()
    behind = make_run()  # created after it: claimed after it, oldest first
    report = services.resume_due(max_seconds=30)
    assert sorted(o.run_id for o in report.outcomes) == sorted([looping, behind])
    assert RunState.objects.get(pk=behind).status == RunStatus.COMPLETED


@pytest.mark.postgres
def test_resume_runs_once_with_lookup_retry_zero_ends(workers):
    run_id = in_doubt_whose_lookup_raises()
    # Before, this pass did not end: 455 turns of the one run in 20 s.
    done = workers.run("--once", "--concurrency", "4", timeout=30, DURABLERUNS_LOOKUP_RETRY_SECONDS="0")
    assert done.returncode == 0, done.stderr
    # The pass leaves the run, due again at once, to the next pass. Another of its threads may take the run in the
    # moment between its release and the pass noting it: at most one turn a thread, never a spin.
    handled = re.search(r"(\d+) run\(s\) handled", done.stdout)
    assert handled is not None and 1 <= int(handled.group(1)) <= 4, done.stdout
    raised = re.search(r"\(raised (\d+) of 120 times in a row", RunState.objects.get(pk=run_id).reason)
    assert raised is not None and 1 <= int(raised.group(1)) <= 4
