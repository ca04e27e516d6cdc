"""The crash budget where nothing is recorded: a worker that dies inside steps declared intent=False (their
results held for a later commit, durableruns.held) leaves no attempt in doubt to count against
DURABLERUNS_MAX_CRASHES. Each claim counts instead the claims in a row that took the run over from a worker whose
lease ran out with the cursor where it was (run_state.takeovers); any other claim starts the count anew. Every
claim path counts: the one-statement claims (with and without concurrency limits in the deploy), the ORM's
(SQLite, a named run), a cluster's. The engine stops such a run for staff at the budget, and a staff retry gives
it a fresh count. (Real workers SIGKILLed at every try: tests/faults/test_crash_matrix.py.)
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from durableruns import registry, services, store
from durableruns.clock import Clock
from durableruns.models import RunState, RunStatus, RunStep
from tests.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)


def later(minutes: int) -> Clock:
    return Clock(shift=timedelta(minutes=minutes))


@pytest.fixture(params=["limits", "no limits"])
def deploy(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """This deploy with its concurrency limits (the tests' workflows declare some: the claim with limits) or as
    one without any (the claim without them)."""
    if request.param == "no limits":
        monkeypatch.setattr(registry, "_limits", (registry._changes, {}))
    return request.param


def test_each_claim_that_takes_a_run_over_from_a_dead_worker_counts_it_and_any_other_claim_starts_anew(deploy):
    run_id = make_run()
    assert store.claim(owner="a", lease_seconds=60).takeovers == 0  # from pending
    assert store.claim(owner="b", lease_seconds=60, clock=later(2)).takeovers == 1  # a's lease ran out: a died
    assert store.claim(owner="c", lease_seconds=60, clock=later(4)).takeovers == 2
    assert store.claim(owner="d", lease_seconds=60, clock=later(4)) is None  # c's lease runs yet: not taken
    RunState.objects.filter(pk=run_id).update(cursor=1)  # c moved the cursor before it died: counted from 1
    assert store.claim(owner="e", lease_seconds=60, clock=later(6)).takeovers == 1
    assert store.claim(owner="f", lease_seconds=60, clock=later(8)).takeovers == 2
    assert store.claim(owner="g", lease_seconds=60, clock=later(10), run_id=run_id).takeovers == 3  # named
    RunState.objects.filter(pk=run_id).update(status=RunStatus.PENDING)  # handed back by a live worker
    assert store.claim(owner="h", lease_seconds=60, clock=later(12)).takeovers == 0
    assert RunState.objects.values_list("takeovers", "takeover_cursor").get(pk=run_id) == (0, 1)


def test_a_run_taken_over_as_often_as_the_crash_budget_with_nothing_recorded_stops_for_staff(deploy, settings):
    settings.DURABLERUNS_MAX_CRASHES = 2
    run_id = make_run("pure_chain", {"calls": "/dev/null"})
    store.claim(owner="a", lease_seconds=60)  # a worker took it, and died inside the chain: nothing recorded
    store.claim(owner="b", lease_seconds=60, clock=later(2))  # so did the next
    report = services.resume_due(clock=later(4))  # the next takes it over a second time in a row: the budget
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.NEEDS_DECISION, run.reason
    assert "died 2 times in a row at price_1" in run.reason and "crash budget of 2" in run.reason, run.reason
    assert report.steps_run == 0 and not RunStep.objects.filter(run_id=run_id).exists()  # nothing run again
    services.retry_run(run_id, by="ops", note="the host ran out of memory; it has more now")
    services.resume_due(clock=later(6))  # a fresh count: the chain runs, and the run completes
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, run.reason
    assert run.takeovers == 0


def test_an_attempt_in_doubt_is_counted_as_it_is_settled_not_by_the_takeovers(settings):
    settings.DURABLERUNS_MAX_CRASHES = 2
    run_id = make_run()
    store.claim(owner="a", lease_seconds=60)
    store.claim(owner="b", lease_seconds=60, clock=later(2))
    store.record_intent(
        store.claim(owner="c", lease_seconds=60, clock=later(4)).lease,
        store.Intent(step="first", attempt=1, effect_key=f"{run_id}:first", cursor=0),
    )
    services.resume_due(clock=later(6))  # three takeovers, one attempt in doubt: re-executed, not stopped
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, run.reason
