"""Several runs a claim in a single pass (durableruns.store.prefetch, durableruns.worker.prefetch): the claim's
order, which first intents ride on it, the runs a pass hands back, and a worker killed holding runs it has not
begun."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.db.models import F
from django.test import override_settings
from django.utils import timezone

from durableruns import services
from durableruns.models import RunState, RunStatus, RunStep, StepStatus
from durableruns.registry import first_steps
from durableruns.store.prefetch import claim_several, hand_back, prefetches
from tests.conftest import CITUS_LANE, wait_until
from tests.factories import make_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres,
              pytest.mark.skipif(CITUS_LANE, reason="a distributed record claims one run at a time")]


def started_steps(run_ids: list[str]) -> dict[str, list[str]]:
    rows = RunStep.objects.filter(run_id__in=run_ids, status=StepStatus.STARTED).values_list("run_id", "step")
    found: dict[str, list[str]] = {run_id: [] for run_id in run_ids}
    for run_id, step in rows:
        found[run_id].append(step)
    return found


def test_a_claim_takes_several_runs_in_the_order_single_claims_would():
    low = [make_run("scripted", {}, run_id=f"low-{n}") for n in range(3)]
    make_run("scripted", {}, run_id="high")
    RunState.objects.filter(pk="high").update(priority=5)
    woken = make_run("scripted", {}, run_id="woken")  # recorded last, due at a wake time before every other start
    RunState.objects.filter(pk=woken).update(status=RunStatus.WAITING, wake_at=timezone.now() - timedelta(hours=1))
    assert prefetches()
    taken = claim_several(owner="w", lease_seconds=30, most=4)
    assert [c.lease.run_id for c in taken] == ["high", "woken", "low-0", "low-1"]
    rows = {r.run_id: r for r in RunState.objects.filter(pk__in=[c.lease.run_id for c in taken])}
    assert {(r.status, r.owner, r.epoch) for r in rows.values()} == {(RunStatus.RUNNING, "w", 1)}
    assert all(r.lease_expires_at is not None and r.wake_at is None for r in rows.values())
    assert RunState.objects.get(pk=low[2]).status == RunStatus.PENDING  # past `most`: left for the next claim
    assert [c.lease.run_id for c in claim_several(owner="v", lease_seconds=30, most=4)] == [low[2]]
    assert claim_several(owner="v", lease_seconds=30, most=4) == []


def test_only_the_run_begun_at_once_has_its_first_intent_in_the_claim(tmp_path):
    for workflow, step, input in (("slow_notice", "send_notice", {"release_file": str(tmp_path / "go")}),
                                  ("scripted", "first", {})):
        run_ids = [make_run(workflow, input) for _ in range(3)]
        taken = claim_several(owner="w", lease_seconds=30, most=3, first_steps=first_steps())
        assert [c.lease.run_id for c in taken] == run_ids
        # The first run is begun at once: its intent rides on the claim, as a claim of one gives it. The others
        # record theirs when they are begun: until then nothing of theirs can be in doubt.
        assert [c.first_intent.step if c.first_intent else None for c in taken] == [step, None, None]
        assert started_steps(run_ids) == {run_ids[0]: [step], run_ids[1]: [], run_ids[2]: []}


def test_a_run_handed_back_is_as_before_its_claim_but_for_the_epoch():
    for _ in range(2):
        make_run("scripted", {})
    first, second = claim_several(owner="w", lease_seconds=30, most=2, first_steps=first_steps())
    assert first.first_intent is not None and second.first_intent is None
    assert hand_back(second)
    row = RunState.objects.get(pk=second.lease.run_id)
    assert (row.status, row.lease_expires_at, row.epoch) == (RunStatus.PENDING, None, 1)
    assert not RunStep.objects.filter(run_id=second.lease.run_id).exists()
    assert not hand_back(second)  # once only
    RunState.objects.filter(pk=first.lease.run_id).update(epoch=F("epoch") + 1)  # someone else's now
    assert not hand_back(first)
    assert RunStep.objects.filter(run_id=first.lease.run_id, status=StepStatus.STARTED).count() == 1
    assert services.resume_due(concurrency=1).counts() == {"completed": 1}  # the other is leased to its owner
    assert RunState.objects.get(pk=second.lease.run_id).status == RunStatus.COMPLETED
    assert set(RunStep.objects.filter(run_id=second.lease.run_id).values_list("attempt", flat=True)) == {1}


def test_a_run_cancelled_while_claimed_ahead_is_let_go_when_handed_back():
    for _ in range(2):
        make_run("scripted", {})
    first, second = claim_several(owner="w", lease_seconds=30, most=2, first_steps=first_steps())
    services.cancel_run(second.lease.run_id, by="ops", note="ordered twice")
    row = RunState.objects.get(pk=second.lease.run_id)
    assert row.status == RunStatus.CANCELLED and row.lease_expires_at is not None  # kept: its worker may act
    # It never began: nothing of it can be at a far system, so handing it back lets go of the lease (a limited
    # run's slot) at once instead of when the lease runs out.
    assert not hand_back(second)
    row = RunState.objects.get(pk=second.lease.run_id)
    assert (row.status, row.lease_expires_at) == (RunStatus.CANCELLED, None)
    assert hand_back(first)  # the other, still this claim's, is handed back as before
    assert RunState.objects.get(pk=first.lease.run_id).status == RunStatus.PENDING


def test_a_pass_works_every_run_once_with_fewer_claims_than_runs():
    run_ids = [make_run("pool_napping", {"nap": 0}) for _ in range(20)]
    report = services.resume_due(concurrency=2, owner="host:1")
    assert report.counts() == {"completed": 20} and report.steps_run == 40
    assert report.claims < 15, report.summary()  # one run a claim: 20 claims, and one per thread finding nothing
    assert RunStep.objects.filter(run_id__in=run_ids).count() == 40
    assert set(RunStep.objects.filter(run_id__in=run_ids).values_list("attempt", flat=True)) == {1}


@override_settings(DURABLERUNS_PREFETCH=1)
def test_one_run_a_claim_when_set_so():
    for _ in range(6):
        make_run("pool_napping", {"nap": 0})
    assert not prefetches()
    report = services.resume_due(concurrency=1)
    assert report.counts() == {"completed": 6} and (report.claims, report.found_nothing) == (7, 1)


def test_a_budget_takes_no_more_runs_than_it_allows(workers):
    run_ids = [make_run("pool_napping", {"nap": 0}) for _ in range(7)]
    done = workers.run("--once", "--limit", "3", "--concurrency", "1", timeout=60)
    assert done.returncode == 0, done.stderr
    states = dict(RunState.objects.filter(pk__in=run_ids).values_list("run_id", "status"))
    assert sorted(states.values()).count(RunStatus.COMPLETED) == 3
    untouched = RunState.objects.filter(pk__in=run_ids, status=RunStatus.PENDING)
    assert untouched.count() == 4 and set(untouched.values_list("epoch", flat=True)) == {0}  # never claimed


def test_a_stopped_pass_hands_back_the_runs_it_had_not_begun(workers):
    run_ids = [make_run("pool_napping", {"nap": 1.0}) for _ in range(4)]
    proc = workers.start("--once", "--concurrency", "1", "--lease", "30")
    wait_until(lambda: RunStep.objects.filter(run_id__in=run_ids).exists(), timeout=30, what="the first step")
    assert RunState.objects.filter(pk__in=run_ids, status=RunStatus.RUNNING).count() == 4  # one claim took all
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert "handed back 3 run(s) claimed ahead" in err, err
    rows = RunState.objects.filter(pk__in=run_ids)
    assert {r.status for r in rows} <= {RunStatus.PENDING, RunStatus.WAITING, RunStatus.COMPLETED}
    assert all(r.lease_expires_at is None for r in rows)  # due at once for any worker, not after a lease
    not_begun = [r.run_id for r in rows if r.cursor == 0 and not RunStep.objects.filter(run_id=r.run_id).exists()]
    assert len(not_begun) == 3
    done = workers.run("--once", "--concurrency", "2", timeout=60)
    assert done.returncode == 0, done.stderr
    assert RunState.objects.filter(pk__in=run_ids, status=RunStatus.COMPLETED).count() == 4
    assert set(RunStep.objects.filter(run_id__in=run_ids, step="nap").values_list("attempt", flat=True)) == {1}


def test_a_worker_killed_holding_runs_it_had_not_begun_leaves_none_of_them_in_doubt(workers, tmp_path):
    release = tmp_path / "go"
    run_ids = [make_run("slow_notice", {"release_file": str(release), "hold_max": 60}) for _ in range(4)]
    proc = workers.start("--once", "--concurrency", "1", "--lease", "2")
    wait_until(lambda: RunStep.objects.filter(run_id__in=run_ids).exists(), timeout=30, what="the first step")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    assert RunState.objects.filter(pk__in=run_ids, status=RunStatus.RUNNING).count() == 4  # one claim took all
    begun = [run_id for run_id, steps in started_steps(run_ids).items() if steps]
    assert len(begun) == 1  # the three waiting in the pass recorded no intent: nothing of theirs is in doubt
    release.touch()
    wait_until(lambda: not RunState.objects.filter(pk__in=run_ids, lease_expires_at__gt=timezone.now()).exists(),
               timeout=30, what="the dead worker's leases to run out")
    done = workers.run("--once", "--concurrency", "2", timeout=60)
    assert done.returncode == 0, done.stderr
    states = dict(RunState.objects.filter(pk__in=run_ids).values_list("run_id", "status"))
    # The one begun is in doubt, escalate: a person decides; the three never begun simply ran, each once.
    assert states == {run_id: RunStatus.NEEDS_DECISION if run_id in begun else RunStatus.COMPLETED
                      for run_id in run_ids}
    assert set(RunStep.objects.filter(run_id__in=run_ids).values_list("attempt", flat=True)) == {1}


def test_a_worker_killed_holding_re_executable_runs_runs_only_the_step_in_hand_again(workers):
    run_ids = [make_run("pool_napping", {"nap": 2.0}) for _ in range(4)]
    proc = workers.start("--once", "--concurrency", "1", "--lease", "2")
    wait_until(lambda: RunStep.objects.filter(run_id__in=run_ids).exists(), timeout=30, what="the first step")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    assert RunState.objects.filter(pk__in=run_ids, status=RunStatus.RUNNING).count() == 4  # one claim took all
    [begun] = [run_id for run_id, steps in started_steps(run_ids).items() if steps]
    wait_until(lambda: not RunState.objects.filter(pk__in=run_ids, lease_expires_at__gt=timezone.now()).exists(),
               timeout=30, what="the dead worker's leases to run out")
    done = workers.run("--once", "--concurrency", "4", timeout=60)
    assert done.returncode == 0, done.stderr
    assert RunState.objects.filter(pk__in=run_ids, status=RunStatus.COMPLETED).count() == 4
    attempts = {run_id: sorted(RunStep.objects.filter(run_id=run_id, step="nap").values_list("attempt", flat=True))
                for run_id in run_ids}
    # The step in doubt runs again (re_executable); the runs claimed ahead had never begun: one attempt each.
    assert attempts == {run_id: [1, 2] if run_id == begun else [1] for run_id in run_ids}


def test_a_pass_past_its_max_seconds_hands_back_the_runs_it_had_not_begun(workers):
    run_ids = [make_run("pool_napping", {"nap": 0.5}) for _ in range(4)]
    done = workers.run("--once", "--concurrency", "1", "--max-seconds", "0.5", timeout=60)
    assert done.returncode == 0, done.stderr
    assert "handed back 3 run(s) claimed ahead" in done.stderr, done.stderr
    rows = RunState.objects.filter(pk__in=run_ids)
    assert all(r.lease_expires_at is None for r in rows)  # none left to a lease: due at once for any worker
    not_begun = [r for r in rows if not RunStep.objects.filter(run_id=r.run_id).exists()]
    assert len(not_begun) == 3 and {r.status for r in not_begun} == {RunStatus.PENDING}
