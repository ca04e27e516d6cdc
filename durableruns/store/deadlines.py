"""A run's deadline in the record: the runs past theirs that no claim will take, and the system act that ends a
run at its deadline, as a staff cancel does (durableruns.deadlines decides when, and says why).

The act takes its locks in the order a staff cancel takes them (store.staff.record_staff_action): the unfinished
descendants first, then the run's open escalation, then the run; the epoch bump fences out a worker inside a step.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F, Q

from durableruns import conf
from durableruns.clock import Clock
from durableruns.encoding import storable
from durableruns.models import Escalation, Intervention, RunState, RunStatus
from durableruns.store.base import DATABASE, ENDED, wake_workers
from durableruns.store.cancels import SYSTEM_ACTOR, announce_cancelled, cancel_descendants, ending_fields, staff_act
from durableruns.store.children import wake_parent


@dataclass(frozen=True, kw_only=True)
class Overdue:
    """A run past its deadline, as the record has it."""

    run_id: str
    created_at: datetime
    deadline_at: datetime
    on_deadline: str  # cancel | fail


@dataclass(frozen=True, kw_only=True)
class Ended:
    """What the act did: the run's status now (pending while a worker gives back what it holds), the descendants
    it cancelled, and its record."""

    status: str
    cancelled: list[str]
    act: Intervention


def overdue_of(run_id: str) -> Overdue | None:
    """The run's deadline facts, or None if it has no deadline."""
    row = (RunState.objects.filter(pk=run_id, deadline_at__isnull=False)
           .values_list("run_id", "created_at", "deadline_at", "on_deadline").first())
    return None if row is None else _overdue(*row)


def unclaimable_overdue(*, clock: Clock = DATABASE, limit: int = 100) -> list[Overdue]:
    """The unfinished runs past their deadline that no claim will take now (read by run_state_deadline_idx): a run
    leased by a live worker (inside a long step), one stopped for staff, and one waiting with no wake time or a
    later one (a wait begun after its deadline passed). A pending run, a due one and one whose lease ran out are
    left to the claim, which ends them itself."""
    now = clock.expression()
    rows = (RunState.objects.filter(deadline_at__lte=now, ending="")
            .filter(Q(status=RunStatus.RUNNING, lease_expires_at__gt=now) | Q(status=RunStatus.NEEDS_DECISION)
                    | Q(status=RunStatus.WAITING, wake_at__isnull=True) | Q(status=RunStatus.WAITING, wake_at__gt=now))
            .order_by("deadline_at")
            .values_list("run_id", "created_at", "deadline_at", "on_deadline")[:limit])
    return [_overdue(*row) for row in rows]


def _overdue(run_id: str, created_at: datetime, deadline_at: datetime | None, on_deadline: str | None) -> Overdue:
    assert deadline_at is not None, "read only where deadline_at is set"
    return Overdue(run_id=run_id, created_at=created_at, deadline_at=deadline_at, on_deadline=on_deadline or "cancel")


def end_at_deadline(run_id: str, *, final: str, reason: str, epoch: int | None = None,
                    clock: Clock = DATABASE) -> Ended | None:
    """End the run `final` (cancelled or failed) because its deadline passed, as a staff cancel does and recorded
    as a system act (decided_by SYSTEM_ACTOR, no user, the reason as its note): its unfinished descendants are
    cancelled, its open escalation closed, its worker fenced out by the epoch bump, and where it holds something a
    worker gives it back first (pending, ending `final`). One commit.

    None, with nothing written, if the run has ended, is ending already, is not past its deadline by the
    database's clock, or (with `epoch`, a claim's) is no longer held under that epoch."""
    cascade = f"cancelled with {run_id}: {reason}"
    seen: set[str] = set()
    with transaction.atomic(using=conf.database(), durable=True):
        now = clock.now()
        cancelled = cancel_descendants(run_id, reason=cascade, decided_by=SYSTEM_ACTOR, user_id=None, now=now,
                                       seen=seen)
        pending = (Escalation.objects.select_for_update(of=("self",))
                   .filter(run_id=run_id, decision__isnull=True).first())
        run = RunState.objects.select_for_update().filter(pk=run_id).values_list(
            "status", "ending", "deadline_at", "epoch").first()
        if (run is None or run[0] in ENDED or run[1] or run[2] is None or run[2] > now
                or (epoch is not None and run[3] != epoch)):
            transaction.set_rollback(True, using=conf.database())  # the descendants' cancels with it
            return None
        # A child recorded between the first reading and the run's lock: in the record now, and cancelled too.
        cancelled += cancel_descendants(run_id, reason=cascade, decided_by=SYSTEM_ACTOR, user_id=None, now=now,
                                        seen=seen)
        fields: dict[str, Any] = ending_fields(run_id, final)
        # The lease is left as it is, as a staff cancel leaves it: a worker inside a far call holds a limited
        # run's slot until it lets go (fenced out) or the lease runs out.
        # Unmarked for the alerts (ops.alerts): a run mailed about while stopped for staff is mailed about again.
        RunState.objects.filter(pk=run_id).update(epoch=F("epoch") + 1, wake_at=None, updated_at=now,
                                                  reason=storable(reason), alerted_at=None, **fields)
        if fields["status"] == RunStatus.PENDING:
            wake_workers()  # a worker gives back what it holds, then ends it
        elif fields["status"] in ENDED:
            wake_parent(run_id, clock)
        act = staff_act({"run_id": run_id, "step": "", "attempt": None, "action": Intervention.Action.CANCEL,
                         "decided_by": SYSTEM_ACTOR, "user_id": None, "decided_at": now,
                         "note": storable(reason)}, pending)
    announce_cancelled(cancelled, reason=cascade, by=SYSTEM_ACTOR)
    return Ended(status=fields["status"], cancelled=cancelled, act=act)


# How the reason of a run ended at its deadline begins (durableruns.deadlines.reason): the alerts find them by it.
REASON_PREFIX = "deadline of "


def ended_at_deadline_unmailed() -> list[RunState]:
    """The runs a deadline ended (cancelled or failed) that nobody has been mailed about yet, oldest deadline first,
    read by run_state_deadline_mail_idx (a mail marks them: they leave it)."""
    return list(RunState.objects.filter(status__in=(RunStatus.CANCELLED, RunStatus.FAILED), alerted_at__isnull=True,
                                        reason__startswith=REASON_PREFIX).order_by("deadline_at"))


def take_deadline_alert_mark(run_id: str, *, now: datetime) -> bool:
    """Mark a run a deadline ended as mailed about at `now`, only if no pass has: of two overlapping passes, one
    takes it and sends (a mail that fails gives it back: store.give_run_alert_mark_back)."""
    return bool(RunState.objects.filter(pk=run_id, alerted_at__isnull=True,
                                        status__in=(RunStatus.CANCELLED, RunStatus.FAILED)).update(alerted_at=now))
