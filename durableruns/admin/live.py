"""A run page's live part: the run's latest progress and its attempts' states as a small JSON document, which the
page of an active run asks for every second (a vanilla script, templates/durableruns/admin/run_live.html) and
shows without a reload. Read-only, for whoever may see the run's page; a run out of scope is a 404.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, JsonResponse

from durableruns import timeline
from durableruns.admin.display import ATTEMPT_BADGES, when
from durableruns.models import RunState, RunStep

ACTIVE = ("pending", "running", "waiting", "needs_decision")  # the statuses a run may still move from
POLL_MS = 1000  # how often the page asks


def progress_line(progress: dict[str, Any] | None) -> str:
    """The latest progress as the page says it: "step: message (done/total)"."""
    if progress is None:
        return ""
    counted = ""
    if progress["done"] is not None:
        total = progress["total"] if progress["total"] is not None else "?"
        counted = f" ({progress['done']}/{total})"
    return f"{progress['step']}: {progress['message']}{counted}"


def live_state(run: RunState, rows: list[RunStep]) -> dict[str, Any]:
    """What the page updates: the run's status, its latest progress, each attempt's state."""
    progress = timeline.latest_of(rows)
    return {
        "run_id": run.run_id,
        "status": run.status,
        "active": run.status in ACTIVE,
        "progress": None
        if progress is None
        else {
            **progress,
            "at": when(progress["at"]),
            "line": progress_line(progress),
        },
        "attempts": [
            {
                "step": r.step,
                "attempt": r.attempt,
                "status": r.status,
                "label": ATTEMPT_BADGES.get(r.status, (r.status, "muted"))[0],
                "tone": ATTEMPT_BADGES.get(r.status, (r.status, "muted"))[1],
            }
            for r in rows
        ],
    }


def live_context(run: RunState, rows: list[RunStep]) -> dict[str, Any]:
    """What the run page needs to show the live part as it is now, and to keep it up to date if it may move."""
    state = live_state(run, rows)
    return {"live": state, "live_poll_ms": POLL_MS}


def live_view(model_admin: Any, request: HttpRequest, object_id: str) -> JsonResponse:
    """GET the live state of one run (the run page's script): 403 without the page's permission, 404 out of
    scope or unknown."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    run = model_admin.get_queryset(request).filter(pk=object_id).first()
    if run is None:
        raise Http404("no such run")
    rows = list(
        RunStep.objects.filter(run_id=run.run_id)
        .order_by("started_at", "step", "attempt")
        .only(*timeline.ATTEMPT_FIELDS)
    )
    response = JsonResponse(live_state(run, rows))
    response["Cache-Control"] = "no-store"
    return response
