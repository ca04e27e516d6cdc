"""Django signals for integrations, each sent once the fact it announces is committed, never on a rollback.

Connect a receiver as usual (`@receiver(run_completed)`); every signal is sent with keyword arguments only, and
`sender` is the model the fact is about (RunState, RunStep or Escalation). A receiver's exception is logged
(logger "durableruns") and never reaches the worker or the request that recorded the fact: the fact is already
committed, and an integration's bug must not turn a finished run into a failed pass.

    run_started         sender=RunState   run_id, workflow
                        a run was recorded (services.start_run / durableruns.start); inside the caller's
                        transaction, it is sent only when that transaction commits
    run_completed       sender=RunState   run_id, workflow
    run_failed          sender=RunState   run_id, workflow, reason
    run_cancelled       sender=RunState   run_id, workflow, reason, by (who cancelled or abandoned it, or None
                                          when the engine cancelled it by a step's policy)
    step_in_doubt       sender=RunStep    run_id, workflow, step, attempt, effect_key, policy, cause
                        a worker found an attempt in doubt (its worker died between intent and result, or the
                        call raised without an answer; `cause` is the error then, else ""), before settling it
                        by its policy; sent each time a worker finds it so, e.g. on each pass that waits out a
                        lookup's lag
    attempt_failed      sender=RunStep    run_id, step, attempt, error
                        the far system refused the call (or a re_executable step raised): the attempt is
                        recorded failed; the run retries it or fails by the step's max_attempts
    escalation_opened   sender=Escalation escalation_id, run_id, step, attempt, reason
    escalation_decided  sender=Escalation escalation_id, run_id, step, attempt, action (happened,
                                          did_not_happen, abandon, or cancel when the run was cancelled), by

On PostgreSQL's hot path each fact is one statement in autocommit: the signal is sent right after it, and only
when the signal has receivers, so a site that connects none pays nothing (not even the query for the run's
workflow name, which a finished run's signals look up only then).
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.dispatch import Signal

from durableruns import conf

log = logging.getLogger("durableruns")

run_started = Signal()
run_completed = Signal()
run_failed = Signal()
run_cancelled = Signal()
step_in_doubt = Signal()
attempt_failed = Signal()
escalation_opened = Signal()
escalation_decided = Signal()


def _send(signal: Signal, sender: type, arguments: dict[str, Any]) -> None:
    for receiver, result in signal.send_robust(sender=sender, **arguments):
        if isinstance(result, Exception):
            log.error("a receiver of a durableruns signal raised: %r", receiver, exc_info=result)


def send_on_commit(signal: Signal, sender: type, **arguments: Any) -> None:
    """Send `signal` when the current transaction on the runs' database commits; at once outside any (the fact
    just committed)."""
    if not signal.has_listeners(sender):
        return
    transaction.on_commit(lambda: _send(signal, sender, arguments), using=conf.database())


_FINISHED = {"completed": run_completed, "failed": run_failed, "cancelled": run_cancelled}


def run_finished(run_id: str, status: str, *, reason: str = "", by: str | None = None) -> None:
    """Announce a run that just finished in `status` (nothing for an unfinished status)."""
    from durableruns.models import RunState

    signal = _FINISHED.get(status)
    if signal is None or not signal.has_listeners(RunState):
        return

    def send() -> None:
        found = list(RunState.objects.filter(pk=run_id).order_by().values_list("workflow", flat=True)[:1])
        arguments: dict[str, Any] = {"run_id": run_id, "workflow": found[0] if found else ""}
        if signal is not run_completed:
            arguments["reason"] = reason
        if signal is run_cancelled:
            arguments["by"] = by
        _send(signal, RunState, arguments)

    transaction.on_commit(send, using=conf.database())


def escalation_was_decided(decision: Any) -> None:
    """Announce a staff decision on an escalation (an Intervention with an escalation), once it is committed."""
    from durableruns.models import Escalation

    if decision.escalation_id is None:
        return
    send_on_commit(
        escalation_decided,
        Escalation,
        escalation_id=decision.escalation_id,
        run_id=decision.run_id,
        step=decision.step,
        attempt=decision.attempt,
        action=decision.action,
        by=decision.decided_by,
    )
