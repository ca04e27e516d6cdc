"""Restart an ended run from a step (issue 32): a new run of the same workflow and input under this deploy's plan,
the steps before the chosen one copied from the source, every step from it on keeping the source's effect keys.

Nothing here drives a run: durableruns.store.restarts records the new run as a worker finds it, and the engine's
in-doubt path settles what the source may already have done (a resolvable step is looked up by its key first).
"""

from __future__ import annotations

import uuid
from typing import Any

from durableruns import store
from durableruns.errors import InvalidDecision, InvalidInput
from durableruns.policies import Policy
from durableruns.reading import get_run
from durableruns.registry import get_workflow
from durableruns.store.restarts import record_restart

# The runs that can be restarted: those that have ended (the store checks it again under the source's row lock).
RESTARTABLE = store.ENDED


def restart(run_id: str, from_step: str, *, by: Any, note: str, bulk_id: str | None = None) -> str:
    """Start a new run restarting the ended run `run_id` from `from_step`; return its run_id.

    Only a completed, failed or cancelled run (errors.RunNotActionable otherwise); `from_step` must be a step of
    this deploy's plan, and each step before it must have a completed result in the source (errors.InvalidInput,
    naming it). Recorded as a staff act (who, when, why; `bulk_id` when a bulk act made it) on both runs."""
    decided_by, user_id = who(by)
    if not isinstance(note, str) or not note.strip():
        raise InvalidDecision("a note saying why is required")
    if not isinstance(from_step, str) or not from_step:
        raise InvalidInput("from_step must name a step of the run's plan")
    source = get_run(run_id)
    workflow = get_workflow(source.workflow)
    plan = workflow.as_plan()
    new_id = f"{workflow.name}-{uuid.uuid4().hex[:12]}"
    return record_restart(
        run_id,
        run_id=new_id,
        plan=plan,
        from_step=from_step,
        resolvable=[s.name for s in workflow.steps if s.policy is Policy.RESOLVABLE and s.wait is None],
        acquisitions=[(a.step, a.release_step) for a in workflow.acquisitions()],
        concurrency_key=workflow.limit_key(source.input),
        decided_by=decided_by,
        user_id=user_id,
        note=store.storable(note.strip(), limit=2000),
        bulk_id=bulk_id,
    )


def who(by: Any) -> tuple[str, int | None]:
    """The name and user id a staff act records for `by` (a user, or a non-empty name)."""
    if hasattr(by, "get_username"):
        return by.get_username(), by.pk
    if isinstance(by, str) and by.strip():
        return by.strip(), None
    raise InvalidDecision("`by` must be a user or a non-empty name")
