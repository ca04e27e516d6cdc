"""Who may do what through the API: each act needs the app's model permission for it, reading included.

Permissions are checked before the body is parsed, so a refused request changes nothing and learns nothing
about whether its input would have been valid. Each endpoint names its own, on top of the site's
DURABLERUNS_API_PERMISSION_CLASSES (IsAuthenticated by default), so no global setting can open them.
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class _ModelPermission(BasePermission):
    """Requests whose method is in `methods` need `perm`; others are left to the endpoint's other classes."""

    perm: str = ""
    methods: frozenset[str] = UNSAFE_METHODS

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.method not in self.methods:
            return True
        return bool(request.user and request.user.has_perm(self.perm))


class _ReadPermission(_ModelPermission):
    methods = frozenset(SAFE_METHODS)


class CanViewRuns(_ReadPermission):
    perm = "durableruns.view_runstate"
    message = "Reading runs needs the permission durableruns.view_runstate."


class CanViewEscalations(_ReadPermission):
    perm = "durableruns.view_escalation"
    message = "Reading the escalation queue needs the permission durableruns.view_escalation."


class CanStartRuns(_ModelPermission):
    perm = "durableruns.start_run"
    message = "Starting a run needs the permission durableruns.start_run."


class CanDecideEscalations(_ModelPermission):
    perm = "durableruns.decide_escalation"
    message = "Deciding an escalation needs the permission durableruns.decide_escalation."


class CanSendEvents(_ModelPermission):
    perm = "durableruns.send_event"
    message = "Sending an event to a run needs the permission durableruns.send_event."


class CanDecideApprovals(_ModelPermission):
    perm = "durableruns.decide_approval"
    message = "Deciding an approval needs the permission durableruns.decide_approval."


class CanCancelRuns(_ModelPermission):
    perm = "durableruns.cancel_run"
    message = "Cancelling a run needs the permission durableruns.cancel_run."


class CanRetryRuns(_ModelPermission):
    perm = "durableruns.retry_run"
    message = "Retrying a run needs the permission durableruns.retry_run."


class CanRestartRuns(_ModelPermission):
    perm = "durableruns.restart_run"
    message = "Restarting a run needs the permission durableruns.restart_run."


class CanAdoptPlan(_ModelPermission):
    perm = "durableruns.adopt_plan"
    message = "Moving a run to the current plan needs the permission durableruns.adopt_plan."


class CanUseInbox(BasePermission):
    """The inbox, read or acted on: staff who may decide approvals or escalations (each sees the kinds it may)."""

    message = "The inbox needs the permission durableruns.decide_approval or durableruns.decide_escalation."

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        return bool(
            user and (user.has_perm("durableruns.decide_approval") or user.has_perm("durableruns.decide_escalation"))
        )


class CanActInBulk(_ModelPermission):
    """A bulk act needs, before its body is read, one of the acts' permissions; the act it names then needs its
    own (api.bulks checks that once the action is read)."""

    perms = ("durableruns.cancel_run", "durableruns.retry_run", "durableruns.restart_run")
    message = "A bulk act needs the permission of its act: durableruns.cancel_run, retry_run or restart_run."

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.method not in self.methods:
            return True
        return bool(request.user and any(request.user.has_perm(perm) for perm in self.perms))
