"""Records for the back-office tests, built the way workers leave them (crash traces, then a resume pass)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.utils import timezone

from durableruns import services, testing
from durableruns.models import Escalation, RunState, RunStatus, RunStep, StepStatus
from durableruns.registry import effect_key, get_workflow
from tests.factories import complete, crash_after_intent, make_run


def escalated(run_id: str | None = None) -> Escalation:
    """A scripted run stopped at its escalate step for a person: a crash there, then one resume pass."""
    run_id = make_run("scripted", run_id=run_id)
    complete(run_id, "first", {"order_id": "po_7", "reference": "PO-7"})
    complete(run_id, "second", {"charge_id": "ch_9", "amount": 1200})
    crash_after_intent(run_id, "third", cursor=2)
    services.resume_due(run_id=run_id)
    return Escalation.objects.get(run_id=run_id)


def failed(run_id: str | None = None) -> str:
    """A scripted run whose first step the far system refused on every attempt (needs zero backoff)."""
    run_id = make_run("scripted", input={"first": "reject"}, run_id=run_id)
    services.resume_due(run_id=run_id)
    assert RunState.objects.get(pk=run_id).status == RunStatus.FAILED
    return run_id


def completed(run_id: str | None = None) -> str:
    run_id = make_run("scripted", run_id=run_id)
    services.resume_due(run_id=run_id)
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    return run_id


class WorkerDied(BaseException):
    """Stands for the worker process dying: not an Exception, so nothing in durableruns catches it."""


LEASE = 0.3  # seconds: short, so the resume after the "crash" need not wait out a real lease


def purchase_in_doubt(reference: str = "PO-2026-0041") -> str:
    """A real purchase_order run against the far systems whose worker died right after notify_buyer's intent
    commit, then resumed once: seven steps done with real ids, notify_buyer escalated. Needs the `far` fixture."""
    run_id = services.start_run("purchase_order", {"reference": reference, "buyer": "Acme Ltd", "line_count": 3},
                                run_id=reference)

    def die_after_notify_intent(point: str, step: str) -> None:
        if (point, step) == ("after_intent", "notify_buyer"):
            raise WorkerDied

    testing.arm(die_after_notify_intent)
    try:
        services.resume_due(run_id=run_id, lease_seconds=LEASE)
    except WorkerDied:
        pass
    else:
        raise AssertionError("the worker was meant to die after notify_buyer's intent")
    finally:
        testing.arm(None)
    time.sleep(LEASE)  # the dead worker's lease runs out, as it would after a real crash
    services.resume_due(run_id=run_id)
    assert RunState.objects.get(pk=run_id).status == RunStatus.NEEDS_DECISION
    return run_id


def bulk_purchases(count: int, *, start: int = 0, retries: int = 0, escalate: bool = True) -> list[str]:
    """Write `count` purchase_order runs in a few statements: seven steps done (each after `retries` failed
    attempts), notify_buyer in doubt, and (with `escalate`) an open escalation each. For query-count tests."""
    workflow = get_workflow("purchase_order")
    now = timezone.now()
    runs, steps, escalations = [], [], []
    for n in range(start, start + count):
        run_id = f"bulk-{n:05d}"
        runs.append(RunState(run_id=run_id, workflow=workflow.name, plan_fingerprint=workflow.fingerprint,
                             status=RunStatus.NEEDS_DECISION, cursor=7, input={"reference": f"PO-{n}"},
                             created_at=now - timedelta(seconds=n), updated_at=now))
        for index, step in enumerate(workflow.plan):
            key = effect_key(run_id, step)
            if step == "notify_buyer":
                steps.append(RunStep(run_id=run_id, step=step, attempt=1, status=StepStatus.STARTED, effect_key=key,
                                     started_at=now, owner="w", epoch=1))
                continue
            for attempt in range(1, retries + 1):
                steps.append(RunStep(run_id=run_id, step=step, attempt=attempt, status=StepStatus.FAILED,
                                     effect_key=key, started_at=now, finished_at=now, error="refused", epoch=1))
            steps.append(RunStep(run_id=run_id, step=step, attempt=retries + 1, status=StepStatus.COMPLETED,
                                 effect_key=key, started_at=now, finished_at=now, epoch=1,
                                 result=_result(step, n)))
        if escalate:
            escalations.append(Escalation(run_id=run_id, step="notify_buyer", attempt=1,
                                          effect_key=effect_key(run_id, "notify_buyer"),
                                          in_doubt_since=now - timedelta(seconds=n),
                                          opened_at=now - timedelta(seconds=n),
                                          reason="notify_buyer is in doubt and has no lookup: a person decides"))
    RunState.objects.bulk_create(runs, batch_size=2000)
    RunStep.objects.bulk_create(steps, batch_size=5000)
    Escalation.objects.bulk_create(escalations, batch_size=2000)
    return [r.run_id for r in runs]


def _result(step: str, n: int) -> dict[str, Any]:
    return {"id": f"{step}_{n}", "total": n}
