"""Runs built in bulk for the benchmarks: the same rows services.start_run writes, and the rows a worker
SIGKILLed in the middle of a step leaves behind, so the figures time the engine and not their own set-up.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db.models import JSONField, Value
from django.utils import timezone

from bench.workflows import noop9
from durableruns.models import RunState, RunStatus, RunStep, StepStatus
from durableruns.registry import effect_key, get_workflow

DEAD_OWNER = "dead-worker"
JSON_NULL = Value(None, JSONField())  # what a no-op step's None result is recorded as; Python None is SQL NULL


def _run_rows(workflow: str, count: int, now: datetime, prefix: str, **fields: Any) -> list[Any]:
    fingerprint = get_workflow(workflow).fingerprint
    tag = uuid.uuid4().hex[:8]
    # Distinct creation times keep the claim order (oldest first) the order the runs were made in.
    return [RunState(run_id=f"{prefix}-{tag}-{i:07d}", workflow=workflow, plan_fingerprint=fingerprint, input={},
                     created_at=now + timedelta(microseconds=i), updated_at=now, **fields) for i in range(count)]


def create_pending(count: int, *, workflow: str = noop9.name) -> list[str]:
    """Record ``count`` pending runs, the rows services.start_run writes, in bulk."""
    rows = _run_rows(workflow, count, timezone.now(), "pending", status=RunStatus.PENDING)
    RunState.objects.bulk_create(rows, batch_size=2000)
    return [r.run_id for r in rows]


def create_crashed(count: int, *, workflow: str = noop9.name, done: int = 4) -> list[str]:
    """Record ``count`` runs as a worker SIGKILLed inside step ``done + 1`` leaves them.

    The same rows as tests/factories.py crash_after_intent after ``done`` completed steps: a completed attempt
    per done step, a started attempt of the next step, and the run still `running` under the dead worker's
    epoch with its lease already expired (so a worker may claim it at once).
    """
    plan = get_workflow(workflow).plan
    now = timezone.now()
    crashed_at = now - timedelta(seconds=1)
    runs = _run_rows(workflow, count, now - timedelta(seconds=60), "crashed", status=RunStatus.RUNNING,
                     owner=DEAD_OWNER, epoch=1, cursor=done, lease_expires_at=crashed_at)
    steps = []
    for run in runs:
        for index, step in enumerate(plan[: done + 1]):
            finished = index < done
            steps.append(RunStep(run_id=run.run_id, step=step, attempt=1,
                                 status=StepStatus.COMPLETED if finished else StepStatus.STARTED,
                                 effect_key=effect_key(run.run_id, step), started_at=crashed_at,
                                 finished_at=crashed_at if finished else None,
                                 result=JSON_NULL if finished else None,
                                 resolution="returned" if finished else "", owner=DEAD_OWNER, epoch=1))
    RunState.objects.bulk_create(runs, batch_size=2000)
    RunStep.objects.bulk_create(steps, batch_size=5000)
    return [r.run_id for r in runs]
