"""Approvals and escalations as work for people (durableruns.inbox): an item opened inside the commit that begins an
approval's wait or opens an escalation, closed inside the commit that decides it; taken and released by
conditional updates, reminded and moved on by conditional updates that pick the item on the database's clock.
Every take, release, move and override is a staff act (an Intervention), in the same commit as the change."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, Q

from durableruns import conf
from durableruns.clock import Clock
from durableruns.errors import InboxItemNotFound, ItemTaken
from durableruns.models import Escalation, InboxItem, Intervention
from durableruns.store.base import DATABASE

# Who the system's own acts (a reassignment of an overdue item) are recorded as.
SYSTEM_ACTOR = "durableruns"


@dataclass(frozen=True, kw_only=True)
class Opening:
    """What an item records as it opens: its group ("" for everyone with the permission), how long until it is
    due (None: never), and the group it moves to once overdue by as much again ("": it stays)."""

    group: str = ""
    due: timedelta | None = None
    escalate_to: str = ""


def open_item(
    *,
    run_id: str,
    step: str,
    attempt: int,
    kind: str,
    opening: Opening,
    escalation: Escalation | None = None,
    clock: Clock = DATABASE,
) -> None:
    """Record the item inside the caller's transaction (the one that opens the wait or the escalation); due and
    escalate times are the statement's now plus `due` (and twice `due`), on the database's clock. Once per
    attempt: a second opening of the same attempt (a resume) keeps the first."""
    due, move = opening.due, opening.escalate_to if opening.due is not None else ""
    opened = clock.expression()
    InboxItem.objects.get_or_create(
        run_id=run_id,
        step=step,
        attempt=attempt,
        defaults={
            "kind": kind,
            "escalation": escalation,
            "group": opening.group,
            "escalate_to": move,
            "opened_at": opened,
            # Counted from the very time recorded as its opening: the statement's own now() on PostgreSQL, the one
            # reading on SQLite. In the insert itself (not an update from opened_at after it): a Citus cluster
            # keeps the items in a reference table, where an update may not compute a time from a column.
            "due_at": None if due is None else _after(opened, due, clock),
            "escalate_at": _after(opened, 2 * due, clock) if due is not None and move else None,
        },
    )


def _after(opened: Any, delta: timedelta, clock: Clock) -> Any:
    return opened + delta if isinstance(opened, datetime) else clock.expression(delta)


def guard_decision(
    *, run_id: str, step: str, attempt: int, decided_by: str, user_id: int | None, superuser: bool, now: datetime
) -> None:
    """Inside the decision's commit: refuse a decision by anyone but the item's holder (ItemTaken, so the
    commit records nothing); a superuser's is recorded as an override. Close the item."""
    item = InboxItem.objects.select_for_update().filter(run_id=run_id, step=step, attempt=attempt).first()
    if item is None:
        return
    held = item.claimed_by_user_id is not None or bool(item.claimed_by)
    mine = (
        (item.claimed_by_user_id == user_id) if item.claimed_by_user_id is not None else (item.claimed_by == decided_by)
    )
    if held and not mine:
        if not superuser:
            raise taken(item)
        Intervention.objects.create(
            run_id=run_id,
            step=step,
            attempt=attempt,
            action=Intervention.Action.OVERRIDE,
            decided_by=decided_by,
            user_id=user_id,
            decided_at=now,
            note=f"decided the item {item.claimed_by} held since {item.claimed_at:%Y-%m-%d %H:%M:%S}",
            result={"item": item.pk, "held_by": item.claimed_by},
        )
    InboxItem.objects.filter(pk=item.pk).update(closed_at=now)


def taken(item: InboxItem) -> ItemTaken:
    since = item.claimed_at
    return ItemTaken(
        f"taken by {item.claimed_by} since {since:%Y-%m-%d %H:%M:%S %Z}" if since else f"taken by {item.claimed_by}",
        item_id=item.pk,
        held_by=item.claimed_by,
        held_since=since,
    )


def _act(
    item: InboxItem, action: str, *, by: str, user_id: int | None, now: Any, note: str, result: dict[str, Any]
) -> None:
    Intervention.objects.create(
        run_id=item.run_id,
        step=item.step,
        attempt=item.attempt,
        action=action,
        decided_by=by,
        user_id=user_id,
        decided_at=now,
        note=note,
        result=result,
    )


def take_item(item_id: int, *, by: str, user_id: int | None, clock: Clock = DATABASE) -> InboxItem:
    """Take the item for `by`: one conditional update (open, held by nobody or by `by` already), and the staff
    act, in one commit. Of two people taking it at once one wins; the other gets ItemTaken naming the winner."""
    with transaction.atomic(using=conf.database(), durable=True):
        now = clock.now()
        free = Q(claimed_by_user_id__isnull=True, claimed_by="")
        took = InboxItem.objects.filter(free, pk=item_id, closed_at__isnull=True).update(
            claimed_by=by, claimed_by_user_id=user_id, claimed_at=now
        )
        item: InboxItem | None = InboxItem.objects.filter(pk=item_id, closed_at__isnull=True).first()
        if item is None:
            raise InboxItemNotFound(item_id=item_id)
        if not took:
            if (item.claimed_by_user_id, item.claimed_by) == (user_id, by):
                return item  # held by the caller already: nothing changes, nothing more is recorded
            raise taken(item)
        _act(
            item,
            Intervention.Action.TAKE,
            by=by,
            user_id=user_id,
            now=now,
            note=f"took the {item.kind}",
            result={"item": item.pk},
        )
        return item


def release_item(
    item_id: int, *, by: str, user_id: int | None, superuser: bool = False, clock: Clock = DATABASE
) -> InboxItem:
    """Give the item back: only its holder may (a superuser too, recorded with whom it was taken from); one
    conditional update and the staff act, in one commit. Releasing an item nobody holds changes nothing."""
    with transaction.atomic(using=conf.database(), durable=True):
        now = clock.now()
        item: InboxItem | None = (
            InboxItem.objects.select_for_update().filter(pk=item_id, closed_at__isnull=True).first()
        )
        if item is None:
            raise InboxItemNotFound(item_id=item_id)
        holder = item.claimed_by
        if not holder and item.claimed_by_user_id is None:
            return item
        mine = item.claimed_by_user_id == user_id if item.claimed_by_user_id is not None else holder == by
        if not mine and not superuser:
            raise taken(item)
        InboxItem.objects.filter(pk=item_id, claimed_by=holder, claimed_by_user_id=item.claimed_by_user_id).update(
            claimed_by="", claimed_by_user_id=None, claimed_at=None
        )
        _act(
            item,
            Intervention.Action.RELEASE,
            by=by,
            user_id=user_id,
            now=now,
            note=f"released the {item.kind}" + ("" if mine else f" {holder} held"),
            result={"item": item.pk, "held_by": holder},
        )
        item.claimed_by, item.claimed_by_user_id, item.claimed_at = "", None, None
        return item


def close_stale(*, clock: Clock = DATABASE) -> int:
    """Close the items no decision will close: of a run that ended (cancelled, failed, completed), an escalation
    decided, or an approval that timed out and went on (InboxItemQuerySet.stale: each by a fact seen, never by
    one not seen yet). One statement; the open items' index keeps it small."""
    return int(InboxItem.objects.stale().update(closed_at=clock.expression()))


def due_to_remind(*, clock: Clock = DATABASE, limit: int = 100) -> list[int]:
    """Open items past their due time and never reminded of (candidates: remind() decides)."""
    return list(
        InboxItem.objects.open()
        .filter(reminded_at__isnull=True, due_at__lte=clock.expression())
        .order_by("due_at")
        .values_list("pk", flat=True)[:limit]
    )


def remind(item_id: int, *, clock: Clock = DATABASE) -> bool:
    """Mark the item reminded, in the one statement that finds it due and not reminded yet (the database's
    clock): of any number of workers, one gets True and sends the mail."""
    return bool(
        InboxItem.objects.filter(
            pk=item_id, closed_at__isnull=True, reminded_at__isnull=True, due_at__lte=clock.expression()
        ).update(reminded_at=clock.expression())
    )


def give_reminder_back(item_id: int) -> None:
    """The mail failed: the next look reminds again."""
    InboxItem.objects.filter(pk=item_id).update(reminded_at=None)


def due_to_move(*, clock: Clock = DATABASE, limit: int = 100) -> list[int]:
    """Open items past their escalation moment and not moved yet (candidates: move() decides)."""
    return list(
        InboxItem.objects.open()
        .filter(moved_at__isnull=True, escalate_at__lte=clock.expression())
        .exclude(escalate_to="")
        .order_by("escalate_at")
        .values_list("pk", flat=True)[:limit]
    )


def move(item_id: int, *, clock: Clock = DATABASE) -> InboxItem | None:
    """Move the overdue item to its escalate_to group, released, in the one statement that finds it past its
    escalation moment and not moved yet; the reassignment recorded as a staff act in the same commit. None if
    another worker moved it (or it was decided) first."""
    with transaction.atomic(using=conf.database(), durable=True):
        before = InboxItem.objects.filter(pk=item_id).values_list("group", "claimed_by").first()
        if before is None:
            return None
        moved = (
            InboxItem.objects.filter(
                pk=item_id, closed_at__isnull=True, moved_at__isnull=True, escalate_at__lte=clock.expression()
            )
            .exclude(escalate_to="")
            .update(
                group=F("escalate_to"),
                moved_at=clock.expression(),
                claimed_by="",
                claimed_by_user_id=None,
                claimed_at=None,
            )
        )
        if not moved:
            return None
        item: InboxItem = InboxItem.objects.get(pk=item_id)
        _act(
            item,
            Intervention.Action.REASSIGN,
            by=SYSTEM_ACTOR,
            user_id=None,
            now=item.moved_at,
            note=f"overdue since {item.due_at:%Y-%m-%d %H:%M:%S %Z}: moved from {before[0] or 'everyone'} to "
            f"{item.escalate_to}",
            result={"item": item.pk, "from": before[0], "to": item.escalate_to, "held_by": before[1]},
        )
        return item
