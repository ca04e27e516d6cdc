"""Plain functions that build records for tests, including the trace a crash leaves behind."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from durableruns import services
from durableruns.models import RunState, RunStatus, RunStep, StepStatus
from durableruns.registry import effect_key


def make_run(workflow: str = "scripted", input: dict[str, Any] | None = None, run_id: str | None = None) -> str:
    return services.start_run(workflow, input or {}, run_id=run_id)


def crash_after_intent(run_id: str, step: str, *, attempt: int = 1, started_at: datetime | None = None,
                       cursor: int = 0, loop_cursor: int = 0, progress: dict[str, Any] | None = None) -> None:
    """Leave what a worker killed between its intent and result commits leaves: a started row, a stale lease (one
    that ran out as the step started: the last moment the dead worker could have called is its start)."""
    now = started_at or timezone.now()
    RunStep.objects.create(run_id=run_id, step=step, attempt=attempt, status=StepStatus.STARTED,
                           effect_key=effect_key(run_id, step), started_at=now, held_until=now, owner="dead-worker",
                           epoch=1, loop_cursor=loop_cursor, progress=progress or {})
    RunState.objects.filter(pk=run_id).update(status=RunStatus.RUNNING, owner="dead-worker", epoch=1,
                                              cursor=cursor, lease_expires_at=now)


def complete(run_id: str, step: str, result: Any, *, attempt: int = 1) -> None:
    now = timezone.now()
    RunStep.objects.create(run_id=run_id, step=step, attempt=attempt, status=StepStatus.COMPLETED,
                           effect_key=effect_key(run_id, step), started_at=now, finished_at=now, result=result,
                           owner="dead-worker", epoch=1)


def declare_unchecked(workflow: Any, fn: Any, *, policy: str = "re_executable") -> None:
    """Add `fn` as the workflow's next step the way a deploy from before Workflow.step checked names would have
    (a name the record cannot store): the runs such a deploy recorded are still in the record."""
    from durableruns import registry
    from durableruns.policies import Policy

    step = registry.Step(name=fn.__name__, fn=fn, policy=Policy(policy))
    workflow.steps.append(step)
    workflow._by_name[step.name] = step
    registry._declared()
