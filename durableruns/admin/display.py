"""The back office's presentation: badges, compact summaries, a run's holdings, family and boundary sentence;
every status, zone and outcome has its look (tests/admin/test_display.py checks exhaustiveness).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from durableruns import scopes, services
from durableruns.admin.forms import nesting_depth
from durableruns.boundary import Boundary, StepAttempt, Zone
from durableruns.holdings import HoldState, lapse_phrase
from durableruns.models import (
    RunState,
    RunStatus,
    RunStep,
    StepStatus,
)

# -- presentation: badges and compact summaries ------------------------------------------------------------

# Tones are CSS classes of templates/durableruns/admin/styles.html. Every status and every zone has one
# (tests/admin/test_display.py checks exhaustiveness), so a new status cannot render as a blank cell.
STATUS_TONES: dict[str, str] = {
    RunStatus.PENDING: "info",
    RunStatus.RUNNING: "info",
    RunStatus.WAITING: "warn",
    RunStatus.NEEDS_DECISION: "alert",
    RunStatus.COMPLETED: "ok",
    RunStatus.FAILED: "bad",
    RunStatus.CANCELLED: "muted",
}
ZONE_BADGES: dict[Zone, tuple[str, str]] = {
    Zone.DONE: ("done", "ok"),
    Zone.IN_DOUBT: ("in doubt", "alert"),
    Zone.FAILED: ("failed", "bad"),
    Zone.WAITING: ("waiting", "warn"),
    Zone.NOT_STARTED: ("remaining", "muted"),
}
ATTEMPT_BADGES: dict[str, tuple[str, str]] = {
    StepStatus.STARTED: ("started, no outcome", "alert"),
    StepStatus.COMPLETED: ("completed", "ok"),
    StepStatus.FAILED: ("failed", "bad"),
}
# Mirrors what services.cancel_run / retry_run accept, only to decide which buttons a run page offers;
# the services still refuse anything else.
CANCELLABLE = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.NEEDS_DECISION, RunStatus.FAILED)
RETRYABLE = (RunStatus.FAILED,)


def badge(label: str, tone: str) -> SafeString:
    return format_html('<span class="dr-badge dr-{}">{}</span>', tone, label)


def status_badge(status: str) -> SafeString:
    label = RunStatus(status).label if status in RunStatus.values else status
    return badge(label, STATUS_TONES.get(status, "muted"))


def zone_badge(zone: Zone) -> SafeString:
    label, tone = ZONE_BADGES[zone]
    return badge(label, tone)


def attempt_badge(status: str) -> SafeString:
    label, tone = ATTEMPT_BADGES.get(status, (status, "muted"))
    return badge(label, tone)


def when(moment: datetime | None) -> str:
    """The moment in the site's time zone; a naive one (USE_TZ = False, refused by durableruns.E003 but a
    back office must stay readable) is the site's local time already."""
    if moment is None:
        return "—"
    return (timezone.localtime(moment) if timezone.is_aware(moment) else moment).strftime("%Y-%m-%d %H:%M:%S")


def pretty_json(value: Any) -> str:
    """Indented JSON, or a word saying the value nests too deep to show (JSON's encoders recurse per level)."""
    try:
        return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    except RecursionError:
        return f"(nested too deep to show: {nesting_depth(value)} levels)"


def _short_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and len(str(value)) <= 48


def summarize(result: Any, *, skip: Iterable[Any] = (), limit: int = 3) -> str:
    """Say what a step's result holds in a few words: its identifiers (charge_id, order_id...) if it has any."""
    if result is None:
        return "no result"
    if isinstance(result, dict):
        skipped = set(map(str, skip))
        shown = [(k, v) for k, v in result.items() if _short_scalar(v) and str(v) not in skipped]
        ids = [(k, v) for k, v in shown if k == "id" or k.endswith("_id")]
        # Without ids, references first: JSONB stores keys in its own order, not the step's.
        picked = ids or sorted(shown, key=lambda kv: "ref" not in kv[0])
        return ", ".join(f"{k} {v}" for k, v in picked[:limit]) or f"{{{len(result)} keys}}"
    if isinstance(result, list):
        return f"[{len(result)} items]"
    return str(result) if _short_scalar(result) else Truncator(str(result)).chars(48)


def holds(boundary: Boundary) -> list[dict[str, Any]]:
    """What a run holds meanwhile: each done step with a compact summary of its result (and the full JSON)."""
    out = []
    for step in boundary.done:
        latest = boundary.latest[step]
        out.append({"step": step, "summary": summarize(latest.result, skip=[latest.effect_key]),
                    "json": pretty_json(latest.result)})
    return out


# A hold that lapses within this long is flagged on the queue: waiting longer costs the run what it holds.
LAPSES_SOON = timedelta(hours=1)


def holding_rows(run: RunState, rows: Iterable[RunStep] | None = None) -> list[dict[str, Any]]:
    """What the run holds (or may hold) in other systems, each with its recorded result, since when, and when
    the far system drops it on its own: the run page, the queue and the escalation page show these."""
    now = timezone.now()
    tz = timezone.get_current_timezone()
    out = []
    for h in services.holdings_of(run, rows, held_only=True):
        left = h.lapses_in(now)
        possibly = h.state is HoldState.POSSIBLY_HELD
        line = ("possibly held: in doubt" if possibly else "held") + (
            f" since {h.since.astimezone(tz):%H:%M}" if h.since else "")
        if possibly:
            line += "; a lookup decides" if h.has_lookup else "; no lookup: check the far system by hand"
        if left is not None and not possibly:
            line += f", {lapse_phrase(left)}"
        if h.release_status == "failed":
            line += f"; its release failed ({h.release_attempts} attempt{'s' if h.release_attempts != 1 else ''})"
        elif h.release_status == "started":
            line += "; its release is in doubt"
        out.append({"step": h.step, "line": line, "summary": summarize(h.result, skip=[]),
                    "json": pretty_json(h.result), "since": h.since, "expires_at": h.expires_at,
                    "possibly": possibly, "lapsing": left is not None and left <= LAPSES_SOON,
                    "lapsed": left is not None and left <= timedelta(0)})
    return out


def zone_detail(zone: Zone, latest: StepAttempt | None) -> str:
    """Say, for one step of the plan, what its zone means for this run."""
    if zone is Zone.DONE and latest is not None:
        return f"done at {when(latest.finished_at)} (attempt {latest.attempt})"
    if zone is Zone.IN_DOUBT and latest is not None:
        return (f"in doubt since {when(latest.started_at)} (attempt {latest.attempt}): its intent was "
                f"recorded, its outcome never was")
    if zone is Zone.FAILED and latest is not None:
        error = (latest.error.strip().splitlines() or [""])[-1]
        return f"failed at {when(latest.finished_at)} (attempt {latest.attempt}): {Truncator(error).chars(160)}"
    if zone is Zone.WAITING and latest is not None:
        until = (latest.progress or {}).get("until")
        what = f" for event {latest.progress['event']!r}" if (latest.progress or {}).get("event") else ""
        deadline = f", until {when(datetime.fromisoformat(until))}" if isinstance(until, str) else ""
        return f"waiting{what} since {when(latest.started_at)}{deadline} (attempt {latest.attempt})"
    return "remaining: not started"


def row_boundary(run: RunState) -> Boundary:
    """The run's boundary from its prefetched attempts, computed once per row (list cells share it)."""
    cached = run.__dict__.get("_dr_boundary")
    if cached is None:
        cached = services.boundary_of(run)
        run.__dict__["_dr_boundary"] = cached
    return cached


def boundary_sentence(boundary: Boundary) -> str:
    return boundary.sentence(timezone.get_current_timezone())


def run_url(run_id: str) -> str:
    return reverse("admin:durableruns_runstate_change", args=[quote(run_id)])


# The run page lists at most this many child runs (and says how many there are).
CHILDREN_SHOWN = 200


def family(run: RunState, user: Any = None) -> dict[str, Any]:
    """The run that started `run` and the child runs it started, each linked with its status badge: two index
    reads (the primary key, and the parent index). With `user`, only the runs that user may see
    (durableruns.scopes): a parent out of scope is named as such, without its id."""
    parent = None
    visible = RunState.objects.visible_to(user) if user is not None else RunState.objects.all()
    if run.parent_id is not None:
        found = RunState.objects.filter(pk=run.parent_id).values("run_id", "workflow", "status").first()
        if found and user is not None and not scopes.may_see(user, found["workflow"]):
            parent = {"run_id": "a run outside your workflows", "workflow": "", "url": "", "status": ""}
        else:
            parent = (_relative(found) if found else
                      {"run_id": run.parent_id, "workflow": "", "url": "", "status": "deleted"})
    children = visible.children_of(run.run_id).values("run_id", "workflow", "status")
    shown = [_relative(row) for row in children[:CHILDREN_SHOWN]]
    count = len(shown) if len(shown) < CHILDREN_SHOWN else visible.children_of(run.run_id).count()
    return {"parent": parent, "children": shown, "children_count": count}


def _relative(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"run_id": row["run_id"], "workflow": row["workflow"], "url": run_url(row["run_id"]),
            "status": status_badge(row["status"])}


def escalation_url(escalation_id: int) -> str:
    return reverse("admin:durableruns_escalation_change", args=[escalation_id])


def attempt_row(row: RunStep) -> dict[str, Any]:
    """One attempt as a run's page and the escalation queue list it: its badge, result summary and JSON."""
    return {"row": row, "badge": attempt_badge(row.status), "has_result": row.result is not None,
            "summary": summarize(row.result, skip=[row.effect_key]), "result_json": pretty_json(row.result)}


def attributes_html(attributes: dict[str, str | int], *, compact: bool) -> SafeString:
    """A run's attributes as name=value pairs; `compact` (the runs list) cuts each value to 40 characters."""
    if not attributes:
        return format_html('<span class="dr-why">{}</span>', "none")
    pairs = [(name, Truncator(str(value)).chars(40) if compact else str(value)) for name, value in attributes.items()]
    return format_html_join(" ", '<span class="dr-attr"><strong>{}</strong>={}</span>', pairs)
