"""Who may do what through the API: any signed-in user reads; writing needs the model permission for that act.

Permissions are checked before the body is parsed, so a refused request changes nothing and learns nothing
about whether its input would have been valid.
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request


class _WritePermission(BasePermission):
    """Let reads through (IsAuthenticated guards them); an unsafe method needs `perm`."""

    perm: str = ""

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.method in SAFE_METHODS:
            return True
        return bool(request.user and request.user.has_perm(self.perm))


class CanStartRuns(_WritePermission):
    perm = "durableruns.start_run"
    message = "Starting a run needs the permission durableruns.start_run."


class CanDecideEscalations(_WritePermission):
    perm = "durableruns.decide_escalation"
    message = "Deciding an escalation needs the permission durableruns.decide_escalation."
