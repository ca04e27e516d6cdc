"""durableruns: multi-step business runs that resume from their own record after a crash.

Declare a `Workflow`, start runs with `start`, send them events with `send`, wait for their results with
`result`, let cron call `manage.py resume_runs`, read a run's recovery boundary with `boundary`, and let staff
settle escalated steps and approvals with `decide`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from durableruns import errors
from durableruns.errors import Rejected
from durableruns.registry import Workflow
from durableruns.version import __version__ as __version__  # its home is below the face (tracing reads it)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime, timedelta

    from durableruns.boundary import Boundary
    from durableruns.models import Intervention
    from durableruns.schedules import Schedule

__all__ = [
    "Workflow",
    "Rejected",
    "start",
    "send",
    "result",
    "boundary",
    "decide",
    "adopt_plan",
    "restart",
    "schedule",
    "errors",
]


def start(
    workflow_name: str,
    input: Any,
    run_id: str | None = None,
    *,
    priority: int = 0,
    debounce: timedelta | None = None,
    key: str | None = None,
    deadline: timedelta | datetime | None = None,
) -> str:
    """Record a pending run of `workflow_name` with `input` (a JSON object); return its run_id. Among due runs,
    workers take a higher `priority` first. `deadline` (a timedelta from the start, or an aware datetime; default
    the workflow's own): past it, the run ends as its workflow's on_deadline says (durableruns.deadlines).

    With `debounce` (a timedelta) and `key`: while the run started with this key has not begun, the start replaces
    its input and moves its start to now + debounce (by the database's clock), and returns that run's id; once it
    has begun, the next start with the key starts a new run."""
    from durableruns import services

    return services.start_run(
        workflow_name, input, run_id=run_id, priority=priority, debounce=debounce, key=key, deadline=deadline
    )


def send(run_id: str, event: str, payload: dict[str, Any] | None = None, *, key: str | None = None) -> bool:
    """Record an event for a run (a JSON object; None is {}); False when the run has an event with `key` already.
    A wait for it consumes it, the oldest first; inside the caller's transaction it is part of their commit."""
    from durableruns import services

    return services.send_event(run_id, event, payload, key=key)


def result(run_id: str, *, timeout: float | None = None) -> dict[str, Any]:
    """Wait until the run ends and return its results by step ({step: result}); errors.RunFailed or
    errors.RunCancelled (with the reason) if it did not complete, TimeoutError after `timeout` seconds,
    errors.RunNotFound for an unknown run. LISTENs on PostgreSQL, polls elsewhere."""
    from durableruns import services

    return services.wait_for_result(run_id, timeout=timeout)


def boundary(run_id: str) -> Boundary:
    """Return the run's recovery boundary: `.done`, `.in_doubt`, `.remainder`, `.status`; str() says it."""
    from durableruns import services

    return services.run_boundary(run_id)


def decide(run_id: str, step: str, outcome: str, *, by: Any, note: str, result: Any = None) -> Intervention:
    """Decide an escalated step: 'happened', 'did_not_happen' or 'abandon'; or an approval: 'approve' or 'reject'.
    Applies once, recorded with who, when and why."""
    from durableruns import services

    return services.decide(run_id, step, outcome, by=by, note=note, result=result)


def adopt_plan(run_id: str, *, by: Any, note: str) -> Intervention:
    """Move a run to this deploy's plan of its workflow, where its record fits (else errors.PlanMismatch, naming
    the step); recorded with who, when, why, and from which plan to which."""
    from durableruns import services

    return services.adopt_plan(run_id, by=by, note=note)


def restart(run_id: str, from_step: str, *, by: Any, note: str) -> str:
    """Start a new run of an ended run's workflow and input from `from_step`, under this deploy's plan; return its
    run_id. The steps before it are copied with the source's results; from it on every step keeps the source's
    effect key, and a resolvable step the source attempted is looked up by that key before it is called."""
    from durableruns import restarts

    return restarts.restart(run_id, from_step, by=by, note=note)


def schedule(
    name: str,
    workflow: Any,
    cron: str,
    *,
    input: Mapping[str, Any] | None = None,
    timezone: str = "UTC",
    catch_up: str = "latest",
) -> Schedule:
    """Declare, in a workflows.py, one run of `workflow` per slot of `cron` in `timezone`, with run_id
    "<name>@<slot in ISO 8601, UTC>"; resume_runs starts each slot's run once, whatever the number of workers.
    After downtime, catch_up="latest" starts the latest missed slot only, "all" every one (capped)."""
    from durableruns import schedules

    return schedules.schedule(name, workflow, cron, input=input, timezone=timezone, catch_up=catch_up)
