"""The inbox (durableruns.inbox) in the back office: /admin/durableruns/inbox/, the open approvals and
escalations for the person signed in, the overdue first, each with Take / Release and a link to the page that
decides it; in the sidebar and the app index with its count; and the approval queue's own entry there.

Each take and release is one services call (durableruns.inbox) whose typed error becomes a message."""

from __future__ import annotations

import contextvars
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.functional import lazy

from durableruns import inbox, services
from durableruns.admin.base import ReadOnlyRecord
from durableruns.admin.display import run_url, status_badge, when
from durableruns.clock import Clock
from durableruns.errors import DurableRunsError
from durableruns.models import ApprovalQueue, Inbox, InboxItem

# The request whose sidebar is being built: the inbox's entry names its count for that person. Set as the admin
# asks each ModelAdmin for its permissions while building the app list, read when the list renders.
_asking: contextvars.ContextVar[HttpRequest | None] = contextvars.ContextVar("durableruns_inbox_asking", default=None)


def _entry() -> str:
    request = _asking.get()
    user = getattr(request, "user", None)
    if user is None or not getattr(user, "is_authenticated", False):
        return "inbox"  # as the model declares it (what a migration records)
    count = getattr(request, "_durableruns_inbox_count", None)
    if count is None:
        count = inbox.count(user)
        request._durableruns_inbox_count = count  # type: ignore[union-attr]
    return f"inbox ({count})"


def _may_use(request: HttpRequest) -> bool:
    return bool(inbox.kinds_for(request.user))


@admin.register(Inbox)
class InboxAdmin(ReadOnlyRecord):
    """The person's inbox: a page of its own (not a change list), the record never edited here."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        _asking.set(request)
        return _may_use(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _may_use(request)

    def get_urls(self) -> list[Any]:
        return super().get_urls()[:1]  # the list alone: an item opens the page that decides it

    @services.non_atomic_requests  # a take or a release is its own durable transaction
    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """GET the inbox (?all=1: every open item the person may decide, not only theirs); POST take or
        release one item (its id, the button pressed)."""
        if not _may_use(request):
            raise PermissionDenied
        if request.method == "POST":
            act, item_id = request.POST.get("act"), request.POST.get("item", "")
            try:
                if act == "take":
                    item = inbox.take(item_id, user=request.user)
                    self.message_user(request, f"You hold {item.step} of {item.run_id} now: only you decide it "
                                               f"until you release it.", messages.SUCCESS)
                elif act == "release":
                    item = inbox.release(item_id, user=request.user)
                    self.message_user(request, f"Released {item.step} of {item.run_id}.", messages.SUCCESS)
                else:
                    self.message_user(request, "Nothing was recorded: take or release?", messages.ERROR)
            except DurableRunsError as exc:  # ItemTaken, NotAssigned, InboxItemNotFound: nothing recorded
                self.message_user(request, f"Nothing was recorded: {exc}.", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())
        everything = request.GET.get("all") == "1"
        now = Clock().now()
        rows = [self.row(item, request, now) for item in
                inbox.items(request.user, mine=not everything).prefetch_related("run__attributes")[:200]]
        context = {**self.admin_site.each_context(request), "opts": self.opts, "title": "Inbox", "subtitle": None,
                   "rows": rows, "everything": everything, "now": now, **(extra_context or {})}
        return TemplateResponse(request, "durableruns/admin/inbox.html", context)

    @staticmethod
    def row(item: InboxItem, request: HttpRequest, now: Any) -> dict[str, Any]:
        mine = item.claimed_by_user_id == request.user.pk and bool(item.claimed_by)
        if item.kind == InboxItem.Kind.ESCALATION and item.escalation_id is not None:
            opens = reverse("admin:durableruns_escalation_change", args=[item.escalation_id])
        else:
            opens = reverse("admin:durableruns_approvals") + "?" + urlencode({"run": item.run_id}) + \
                f"#approval-{item.pk}"
        return {
            "item": item, "run_url": run_url(item.run_id), "status": status_badge(item.run.status),
            "attributes": services.attributes_of(item.run), "opens": opens,
            "assignee": item.group or "everyone who may decide it",
            "due": when(item.due_at) if item.due_at else "", "overdue": item.due_at is not None and item.due_at <= now,
            "since": when(item.claimed_at), "mine": mine, "held": bool(item.claimed_by),
            "may_take": not item.claimed_by and inbox.may_take(request.user, item),
            "may_release": bool(item.claimed_by) and (mine or request.user.is_superuser),
        }


@admin.register(ApprovalQueue)
class ApprovalQueueAdmin(ReadOnlyRecord):
    """The approval queue's entry in the sidebar and the app index: it leads to the queue itself."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return user.has_perm("durableruns.decide_approval") or user.has_perm("durableruns.view_runstate")

    def get_urls(self) -> list[Any]:
        return super().get_urls()[:1]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return HttpResponseRedirect(reverse("admin:durableruns_approvals"))


# The sidebar's and the app index's name of the inbox: its count for the person signed in (see _asking).
Inbox._meta.verbose_name_plural = lazy(_entry, str)()
