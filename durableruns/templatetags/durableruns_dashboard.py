"""The dashboard on the admin's durableruns page (templates/admin/durableruns/app_index.html), shown to the staff
the runs list admits; the charts come from durableruns.ops.dashboard."""

from __future__ import annotations

from typing import Any

from django import template

from durableruns import inbox, scopes
from durableruns.ops import dashboard

register = template.Library()

# Whoever the runs list admits (RunStateAdmin.has_view_permission) sees the dashboard.
SEES_RUNS = ("view_runstate", "cancel_run", "retry_run", "decide_escalation")


@register.inclusion_tag("durableruns/admin/dashboard.html", takes_context=True)
def durableruns_dashboard(context: template.Context) -> dict[str, Any]:
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not any(user.has_perm(f"durableruns.{p}") for p in SEES_RUNS):
        return {"charts": None}
    built = dashboard.build(hidden=scopes.hidden_workflows(user))
    if inbox.kinds_for(user):  # the person's inbox: what is theirs to take, and how much of it is overdue
        built["inbox"] = inbox.summary(user, now=built["now"])
    return built
