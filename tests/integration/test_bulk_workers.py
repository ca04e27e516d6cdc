"""Bulk acts worked by real `resume_runs` processes on PostgreSQL: a worker SIGKILLed inside a batch's commit (the
crash point bulk:N, durableruns.faults) leaves that batch's runs as they were, and the workers that come after
act on every matching run exactly once in the end; two --loop workers share a bulk."""

from __future__ import annotations

import signal
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from durableruns import bulks
from durableruns.bulk_models import BulkItem
from durableruns.models import Intervention, RunState, RunStatus, RunStep, StepStatus
from durableruns.registry import effect_key, get_workflow
from tests.api.conftest import bulk_runs
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

RUNS = 120


def completed_runs(n: int) -> list[str]:
    """`n` runs of `scripted` that completed every step, inserted at once."""
    now = timezone.now()
    fingerprint = get_workflow("scripted").fingerprint
    ids = [f"done-{i:03d}" for i in range(n)]
    RunState.objects.bulk_create(
        RunState(run_id=run_id, workflow="scripted", plan_fingerprint=fingerprint, input={"n": i},
                 status=RunStatus.COMPLETED, cursor=3, created_at=now - timedelta(seconds=i), updated_at=now)
        for i, run_id in enumerate(ids))
    RunStep.objects.bulk_create(
        RunStep(run_id=run_id, step=step, attempt=1, status=StepStatus.COMPLETED, result={"step": step},
                effect_key=effect_key(run_id, step), started_at=now, finished_at=now)
        for run_id in ids for step in ("first", "second", "third"))
    return ids


def finish_with_loop_workers(workers, bulk_id: str, count: int) -> None:
    procs = [workers.start("--loop", "--worker", f"loop-{n}", "--interval", "0.5") for n in range(count)]
    wait_until(lambda: bulks.progress(bulk_id).state == "finished", timeout=60, what="the bulk to finish")
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err


@pytest.mark.parametrize("action", ["cancel", "restart"])
def test_a_worker_killed_mid_bulk_leaves_every_run_acted_on_exactly_once(workers, tmp_path, action):
    if action == "cancel":
        ids = bulk_runs(RUNS)  # waiting with no wake time: no claim takes them, only the bulk acts
        bulk_id, total = bulks.start_bulk("cancel", {"workflow": "scripted"}, by="ops", note="outage")
    else:
        ids = completed_runs(RUNS)
        bulk_id, total = bulks.start_bulk("restart", {"workflow": "scripted", "status": "completed"}, by="ops",
                                          note="fix deployed", from_step="third")
    assert total == RUNS
    # Killed inside the commit of its 70th item: the first batch of 50 committed, the second's twenty acts vanish.
    crashed = workers.run("--worker", "doomed", DURABLERUNS_CRASH_AT=f"{action}@bulk:70",
                          DURABLERUNS_CRASH_MARKER=str(tmp_path / "crashed"))
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    assert BulkItem.objects.filter(bulk_id=bulk_id, state="done").count() == 50
    assert BulkItem.objects.filter(bulk_id=bulk_id, state="pending").count() == RUNS - 50
    if action == "cancel":
        assert Intervention.objects.filter(bulk_id=bulk_id).count() == 50
        assert RunState.objects.filter(pk__in=ids, status=RunStatus.CANCELLED).count() == 50
    else:
        assert Intervention.objects.filter(bulk_id=bulk_id).count() == 100  # on the source and on the new run
        assert RunState.objects.filter(restarted_from__in=ids).count() == 50

    finish_with_loop_workers(workers, bulk_id, 2)

    progress = bulks.progress(bulk_id)
    assert (progress.total, progress.done, progress.failed) == (RUNS, RUNS, [])
    if action == "cancel":
        assert set(RunState.objects.filter(pk__in=ids).values_list("status", flat=True)) == {RunStatus.CANCELLED}
        assert Counter(Intervention.objects.filter(bulk_id=bulk_id).values_list("run_id", flat=True)) == {
            run_id: 1 for run_id in ids}
        assert Intervention.objects.filter(run_id__in=ids).count() == RUNS  # no act without the bulk's id
    else:
        restarted = Counter(RunState.objects.filter(restarted_from__in=ids).values_list("restarted_from", flat=True))
        assert restarted == {run_id: 1 for run_id in ids}
        assert Counter(Intervention.objects.filter(bulk_id=bulk_id, run_id__in=ids).values_list(
            "run_id", flat=True)) == {run_id: 1 for run_id in ids}
