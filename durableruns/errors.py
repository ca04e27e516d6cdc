"""The exception tree of durableruns. Every error carries its facts as attributes; the edges translate.

    DurableRunsError
    ├── DeclarationError          a workflow or step is declared wrongly (at import time)
    ├── UnknownWorkflow           no workflow is registered under that name
    ├── InvalidInput              a run's input is not a JSON object
    ├── DuplicateRun              a run with that run_id exists already
    ├── RunNotFound               no run has that run_id
    ├── BulkNotFound              no bulk act has that bulk_id
    ├── RunFailed                 result(): the run ended failed (carries run_id and reason)
    ├── RunCancelled              result(): the run ended cancelled (carries run_id and reason)
    ├── ResultNotJSON             a step returned (or a decision supplied) a value that is not JSON
    ├── EffectInTransaction       a step was about to act inside an open database transaction
    ├── FencedOut                 this worker's epoch is stale: another worker owns the run now
    ├── EscalationNotFound        no open escalation for that run and step
    │   └── ApprovalNotFound      the run does not wait for that approval
    ├── AlreadyDecided            the escalation was decided before (carries who decided first)
    ├── InvalidDecision           the outcome is not one of happened / did_not_happen / abandon
    ├── RunNotActionable          a staff action does not fit the run's status (cancel a completed run, ...)
    ├── PlanMismatch              adopt_plan refused: the run's record does not fit the current plan (names the step)
    ├── InboxItemNotFound         no open inbox item has that id (or its run is out of the caller's scope)
    ├── ItemTaken                 another person holds the inbox item (carries held_by and held_since)
    ├── NotAssigned               the inbox item is assigned to a group the caller is not a member of
    └── NotMeasurable             measure_loop cannot measure that step (unknown, not re_executable, no loop)

`Rejected` is not in this tree: it is what a step raises to say the far system refused the call, an
observed failure. The engine records it as a failed attempt.
"""

from __future__ import annotations

from typing import Any


class DurableRunsError(Exception):
    """A durableruns error."""

    def __init__(self, message: str | None = None, **facts: Any) -> None:
        self.facts = facts
        for name, value in facts.items():
            setattr(self, name, value)
        text = message or (self.__doc__ or "").strip().splitlines()[0].rstrip(".")
        if facts and message is None:
            text = f"{text}: {', '.join(f'{k}={v!r}' for k, v in facts.items())}"
        super().__init__(text)


class DeclarationError(DurableRunsError):
    """The workflow or step declaration is invalid."""


class UnknownWorkflow(DurableRunsError):
    """No workflow is registered under that name."""


class InvalidInput(DurableRunsError):
    """The run's input must be a JSON object."""


class DuplicateRun(DurableRunsError):
    """A run with that run_id exists already."""


class RunNotFound(DurableRunsError):
    """No run has that run_id."""


class BulkNotFound(DurableRunsError):
    """No bulk act has that bulk_id."""


class RunFailed(DurableRunsError):
    """The run ended failed: it has no results to return."""

    run_id: str
    reason: str

    def __init__(self, message: str | None = None, *, run_id: str, reason: str = "") -> None:
        super().__init__(
            message or f"run {run_id} failed: {reason or 'no reason recorded'}", run_id=run_id, reason=reason
        )


class RunCancelled(DurableRunsError):
    """The run ended cancelled: it has no results to return."""

    run_id: str
    reason: str

    def __init__(self, message: str | None = None, *, run_id: str, reason: str = "") -> None:
        super().__init__(
            message or f"run {run_id} was cancelled: {reason or 'no reason recorded'}", run_id=run_id, reason=reason
        )


class ResultNotJSON(DurableRunsError):
    """The value is not JSON: it cannot be recorded."""


class EffectInTransaction(DurableRunsError):
    """A step may not act inside an open database transaction: a rollback would erase the evidence of its effect."""


class FencedOut(DurableRunsError):
    """This worker's epoch is stale: another worker claimed the run, so nothing more is written."""


class EscalationNotFound(DurableRunsError):
    """No such escalation."""


class ApprovalNotFound(EscalationNotFound):
    """The run does not wait for that approval."""


class AlreadyDecided(DurableRunsError):
    """This escalation was decided already; a decision applies once."""


class InvalidDecision(DurableRunsError):
    """The outcome must be one of: happened, did_not_happen, abandon (approve or reject, for an approval)."""


class RunNotActionable(DurableRunsError):
    """The run's status does not allow that action."""


class InboxItemNotFound(DurableRunsError):
    """No open inbox item has that id."""


class ItemTaken(DurableRunsError):
    """Another person holds this inbox item: only they decide it (or a superuser, recorded as an override)."""


class NotAssigned(DurableRunsError):
    """The inbox item is assigned to a group you are not a member of."""


class PlanMismatch(DurableRunsError):
    """The run's record does not fit the current plan: moving it there would skip, repeat or reorder a step."""


class NotMeasurable(DurableRunsError):
    """That step's loop cannot be measured."""


class Unsupported(DurableRunsError):
    """What was asked cannot be done on this site's record as it is laid out: refused before anything is recorded
    (the API's 400 `unsupported`). Until 0.2.0's last changes a record distributed by Citus refused debounced starts
    and runs of limited workflows with it; both run there now (docs/citus.md), and nothing raises it. Kept so that
    code catching it stays valid."""


class Rejected(Exception):
    """Raise from a step when the far system definitely refused the call: an observed failure, not an unknown."""
