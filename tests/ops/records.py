"""Records the ops tests build: runs in a given status that last changed a given time ago (by the database's
clock), with attempts, escalations and staff decisions hanging on them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from durableruns.clock import Clock
from durableruns.models import Escalation, Intervention, RunState, RunStep, StepStatus
from tests.factories import make_run


def aged_run(
    status: str, *, days: float = 0, seconds: float = 0, workflow: str = "scripted", attempts: int = 1, **fields: Any
) -> str:
    """A run in `status` whose last change (its finish, for a finished run) was `days` + `seconds` ago."""
    run_id = make_run(workflow)
    when = Clock().now() - timedelta(days=days, seconds=seconds)
    for n in range(attempts):
        RunStep.objects.create(
            run_id=run_id,
            step=("first", "second", "third")[n % 3],
            attempt=1 + n // 3,
            status=StepStatus.COMPLETED,
            effect_key=f"{run_id}:{n}",
            started_at=when,
            finished_at=when,
            result={"n": n},
            owner="w",
            epoch=1,
        )
    RunState.objects.filter(pk=run_id).update(status=status, updated_at=when, created_at=when, **fields)
    return run_id


def escalate(
    run_id: str, *, step: str = "second", opened_ago: timedelta = timedelta(0), decided: bool = False
) -> Escalation:
    """Open an escalation on `run_id` `opened_ago` before the database's now; with `decided`, decide it."""
    when = Clock().now() - opened_ago
    escalation = Escalation.objects.create(
        run_id=run_id,
        step=step,
        attempt=1,
        effect_key=f"{run_id}:{step}",
        in_doubt_since=when,
        opened_at=when,
        reason="nobody can look it up",
    )
    if decided:
        Intervention.objects.create(
            run_id=run_id,
            escalation=escalation,
            step=step,
            attempt=1,
            action=Intervention.Action.HAPPENED,
            decided_by="alice",
            decided_at=when,
            note="checked by phone",
            result={"ok": True},
        )
    return escalation


def staff_touch(run_id: str) -> Intervention:
    return Intervention.objects.create(
        run_id=run_id,
        action=Intervention.Action.RETRY,
        decided_by="bob",
        decided_at=Clock().now(),
        note="retried after the outage",
    )


def stopped_by_crash_budget(settings: Any, workflow: str = "scripted") -> str:
    """A run stopped for staff as the issue's review found one: DURABLERUNS_MAX_CRASHES = 1, a worker that died
    after its intent (the started row it leaves), and one pass: needs_decision, with no escalation."""
    from durableruns import services
    from durableruns.models import RunStatus
    from tests.factories import crash_after_intent

    settings.DURABLERUNS_MAX_CRASHES = 1
    run_id = make_run(workflow)
    crash_after_intent(run_id, "first")
    services.resume_due()
    state = RunState.objects.get(pk=run_id)
    assert state.status == RunStatus.NEEDS_DECISION and "crash budget of 1" in state.reason, state.reason
    assert not Escalation.objects.filter(run_id=run_id).exists()
    return run_id
