"""The inbox: approvals and escalations as work for people. Each is an item (durableruns.models.InboxItem) assigned
to a group as it opens (durableruns.assignments), due some time after, taken and released by one person at a time,
reminded of once when due and moved to another group once overdue by as much again.

Who sees what: an item of a run out of the user's scope does not exist for them (durableruns.scopes); a user sees
the kinds they may decide (durableruns.decide_approval, durableruns.decide_escalation); with `mine`, only those
assigned to one of their groups or to nobody in particular, and held by nobody else. Taking an item assigned to a
group needs its membership (a superuser's is never refused). The watchdog of every worker calls `sweep`: each
reminder and each move is picked by one conditional update on the database's clock, so one worker of any number
sends its mail.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage
from django.db.models import Q
from django.urls import NoReverseMatch, reverse

from durableruns import conf, scopes, store
from durableruns.clock import Clock
from durableruns.errors import InboxItemNotFound, NotAssigned
from durableruns.models import InboxItem, RunStatus

log = logging.getLogger("durableruns")

# The permission that decides each kind of item: who sees it, takes it, is reminded of it.
PERMISSIONS = {
    InboxItem.Kind.APPROVAL: "durableruns.decide_approval",
    InboxItem.Kind.ESCALATION: "durableruns.decide_escalation",
}


def kinds_for(user: Any) -> tuple[str, ...]:
    """The kinds of item `user` may decide, so sees in the inbox."""
    return tuple(kind.value for kind, permission in PERMISSIONS.items() if user.has_perm(permission))


def items(user: Any, *, mine: bool = False) -> Any:
    """The open items `user` sees, the overdue first, then by due time, then the oldest (a queryset)."""
    return (
        InboxItem.objects.for_person(user, kinds=kinds_for(user), mine=mine)
        .in_inbox_order()
        .select_related("run", "escalation")
    )


def count(user: Any) -> int:
    """How many open items are the user's to take or decide (the inbox's count in the admin)."""
    return InboxItem.objects.for_person(user, kinds=kinds_for(user), mine=True).count()


def summary(user: Any, *, now: Any) -> dict[str, int]:
    """The dashboard's line about the user's inbox: how many items are theirs, how many of those are overdue."""
    mine = InboxItem.objects.for_person(user, kinds=kinds_for(user), mine=True)
    return {"count": mine.count(), "overdue": mine.filter(due_at__lte=now).count()}


def get_item(item_id: Any, user: Any) -> InboxItem:
    """The open item `item_id` as `user` sees it: InboxItemNotFound for one closed, of a run out of scope, or of
    a kind the user may not decide."""
    try:
        pk = int(item_id)
    except (TypeError, ValueError):
        raise InboxItemNotFound(item_id=str(item_id)[:40]) from None
    found = InboxItem.objects.for_person(user, kinds=kinds_for(user), mine=False).filter(pk=pk).first()
    if found is None:
        raise InboxItemNotFound(item_id=pk)
    return found


def may_take(user: Any, item: InboxItem) -> bool:
    """Whether `user` may take `item`: a superuser, or a member of its group (anyone who may decide it when it
    is assigned to nobody in particular)."""
    return bool(getattr(user, "is_superuser", False)) or not item.group or item.group in scopes.group_names(user)


def take(item_id: Any, *, user: Any, clock: Clock | None = None) -> InboxItem:
    """Take the item for `user` (recorded as a staff act): NotAssigned if they are not in its group, ItemTaken
    naming the holder if someone else has it."""
    item = get_item(item_id, user)
    if not may_take(user, item):
        raise NotAssigned(
            f"the {item.kind} is assigned to {item.group}: you are not a member", item_id=item.pk, group=item.group
        )
    return store.take_item(item.pk, by=user.get_username(), user_id=user.pk, clock=clock or store.DATABASE)


def release(item_id: Any, *, user: Any, clock: Clock | None = None) -> InboxItem:
    """Give the item back (recorded as a staff act): only its holder, or a superuser, may."""
    item = get_item(item_id, user)
    return store.release_item(
        item.pk,
        by=user.get_username(),
        user_id=user.pk,
        superuser=bool(getattr(user, "is_superuser", False)),
        clock=clock or store.DATABASE,
    )


# -- reminders and moves: the watchdog's look --------------------------------------------------------------


@dataclass(kw_only=True)
class Swept:
    """What one look did: the items reminded of and moved (each by this process only), the mails that failed."""

    closed: int = 0  # items closed because no decision will come (their run ended, their approval went on)
    reminded: list[int] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)


def sweep(*, clock: Clock = store.DATABASE, limit: int = 100) -> Swept:
    """Move each item past its escalation moment to its escalate_to group, and remind each item past its due
    time, mailing the group's members once per item: whichever of any number of processes takes the mark."""
    swept = Swept()
    swept.closed = store.close_stale(clock=clock)
    for item_id in store.due_to_move(clock=clock, limit=limit):
        item = store.move(item_id, clock=clock)
        if item is None:
            continue
        swept.moved.append(item_id)
        _mail(item, swept, moved=True)
    for item_id in store.due_to_remind(clock=clock, limit=limit):
        if not store.remind(item_id, clock=clock):
            continue
        item = InboxItem.objects.select_related("run").get(pk=item_id)
        if _mail(item, swept, moved=False):
            swept.reminded.append(item_id)
        else:
            store.give_reminder_back(item_id)
    return swept


def recipients(item: InboxItem) -> tuple[str, ...]:
    """The e-mail addresses of the active members of the item's group who may decide it (everyone who may, when
    it is assigned to nobody in particular), sorted."""
    permission = PERMISSIONS[InboxItem.Kind(item.kind)]
    user_model = get_user_model()
    email_field = user_model.get_email_field_name()
    users = user_model._default_manager.exclude(**{email_field: ""}).exclude(**{f"{email_field}__isnull": True})
    if hasattr(user_model, "is_active"):
        users = users.filter(is_active=True)
    if item.group:
        users = users.filter(groups__name=item.group)
    else:
        app_label, codename = permission.split(".", 1)
        held = {"codename": codename, "content_type__app_label": app_label}
        users = users.filter(
            Q(is_superuser=True)
            | Q(**{f"user_permissions__{k}": v for k, v in held.items()})
            | Q(**{f"groups__permissions__{k}": v for k, v in held.items()})
        )
    return tuple(sorted({getattr(u, email_field) for u in users.distinct() if u.has_perm(permission)}))


def inbox_url() -> str:
    try:
        return conf.admin_base_url() + reverse("admin:durableruns_inbox_changelist")
    except NoReverseMatch:  # a site without the admin
        return ""


def message(item: InboxItem, *, moved: bool, to: tuple[str, ...]) -> EmailMessage:
    """The reminder of one item (or, `moved`, the notice to the group it moved to)."""
    run = item.run
    due = f"{item.due_at:%Y-%m-%d %H:%M %Z}" if item.due_at else "-"
    what = f"was moved to {item.group}: overdue since {due}" if moved else f"is due since {due}"
    lines = [
        f"The {item.kind} of run {run.run_id} ({run.workflow}) at its step {item.step} {what}.",
        "",
        f"Assigned to: {item.group or 'everyone who may decide it'}",
        f"Held by: {item.claimed_by or 'nobody'}",
        f"Open it in the inbox: {inbox_url()}",
        "",
        "You receive this once, as a member of the group it is assigned to.",
    ]
    subject = f"[durableruns] {run.run_id}: {item.step} {'moved to ' + item.group if moved else 'is due'}"
    return EmailMessage(subject=" ".join(subject.split()), body="\n".join(lines), to=list(to))


def _mail(item: InboxItem, swept: Swept, *, moved: bool) -> bool:
    if item.run.status not in (RunStatus.WAITING, RunStatus.NEEDS_DECISION, RunStatus.PENDING, RunStatus.RUNNING):
        return True
    to = recipients(item)
    if not to:
        log.warning("inbox item %s (%s): nobody with an e-mail address to tell", item.pk, item)
        return True
    try:
        message(item, moved=moved, to=to).send(fail_silently=False)
    except Exception as exc:  # an SMTP outage: a reminder's mark is given back, to be sent at the next look
        swept.failed.append((item.pk, f"{type(exc).__name__}: {exc}"))
        log.error("inbox item %s: the mail was not sent: %s", item.pk, exc)
        return False
    return True
