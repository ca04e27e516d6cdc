"""The admin's dashboard: where the runs stand, drawn on the server as SVG (no script, no CDN).

Four charts, each bar a link to the admin list it counts: runs by status, open escalations by how long they have
waited, runs completed per hour over the last 24 hours, and attempts in doubt by workflow. Each chart is one
aggregate query (two for attempts in doubt, six with the database's clock), whatever the number of runs: the
page's number of queries is bounded. Runs by status reads one index entry per run the record keeps (so
retention bounds it); the others read only live runs, open escalations or the last week's runs.

Throughput counts the runs that completed in the last 24 hours among those created in the last 7 days, so the
query walks the created_at index instead of every finished run ever kept; a run that took longer than a week
to complete is not counted in its hour.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.db.models import Count, Q
from django.db.models.functions import Trunc
from django.urls import reverse
from django.utils import timezone

from durableruns.clock import Clock
from durableruns.models import Escalation, RunState, RunStatus
from durableruns.ops.metrics import in_doubt_by_workflow

# Fill colours by status, matching the tones of the admin's badges.
STATUS_COLOURS: dict[str, str] = {
    RunStatus.PENDING: "#3b82f6",
    RunStatus.RUNNING: "#2563eb",
    RunStatus.WAITING: "#d97706",
    RunStatus.NEEDS_DECISION: "#dc2626",
    RunStatus.COMPLETED: "#16a34a",
    RunStatus.FAILED: "#b91c1c",
    RunStatus.CANCELLED: "#6b7280",
}
ESCALATION_AGES: tuple[tuple[str, timedelta | None, str], ...] = (
    ("under 1 hour", timedelta(hours=1), "#f59e0b"),
    ("1 to 4 hours", timedelta(hours=4), "#f97316"),
    ("4 to 24 hours", timedelta(hours=24), "#ea580c"),
    ("1 to 3 days", timedelta(days=3), "#dc2626"),
    ("over 3 days", None, "#7f1d1d"),
)

LABEL_WIDTH = 150
BAR_AREA = 330
ROW = 28


@dataclass(frozen=True, kw_only=True)
class Bar:
    label: str
    value: int
    href: str
    colour: str
    x: float
    y: float
    width: float
    height: float
    text_x: float
    text_y: float
    tick: str = ""  # a column's axis label, when it has one
    label_x: float = 0.0
    tick_y: float = 0.0

    @property
    def value_text(self) -> str:
        return f"{self.value:,}"


@dataclass(frozen=True, kw_only=True)
class Chart:
    key: str
    title: str
    note: str
    bars: tuple[Bar, ...]
    width: int
    height: int
    total: int
    horizontal: bool

    @property
    def total_text(self) -> str:
        return f"{self.total:,}"


def _rows(key: str, title: str, note: str, items: list[tuple[str, int, str, str]]) -> Chart:
    """A horizontal bar per item: label on the left, the bar, its value after it."""
    top = max((value for _, value, _, _ in items), default=0) or 1
    bars = []
    for index, (label, value, href, colour) in enumerate(items):
        width = BAR_AREA * value / top if value else 0.0
        y = index * ROW + 4
        bars.append(
            Bar(
                label=label,
                value=value,
                href=href,
                colour=colour,
                x=LABEL_WIDTH,
                y=y,
                width=max(width, 2.0 if value else 0.0),
                height=ROW - 8,
                text_x=LABEL_WIDTH + width + 6,
                text_y=y + ROW / 2,
                label_x=LABEL_WIDTH - 8,
            )
        )
    return Chart(
        key=key,
        title=title,
        note=note,
        bars=tuple(bars),
        width=LABEL_WIDTH + BAR_AREA + 70,
        height=max(len(items), 1) * ROW + 4,
        total=sum(v for _, v, _, _ in items),
        horizontal=True,
    )


COLUMN = 20
COLUMN_AREA = 120


def _columns(key: str, title: str, note: str, items: list[tuple[str, int, str, str, str]]) -> Chart:
    """A vertical bar per item (an hour), value above it, an axis label under every sixth."""
    top = max((value for _, value, _, _, _ in items), default=0) or 1
    bars = []
    for index, (label, value, href, colour, tick) in enumerate(items):
        height = COLUMN_AREA * value / top if value else 0.0
        x = 30 + index * COLUMN
        y = 20 + COLUMN_AREA - height
        bars.append(
            Bar(
                label=label,
                value=value,
                href=href,
                colour=colour,
                x=x,
                y=y,
                width=COLUMN - 4,
                height=height,
                text_x=x + (COLUMN - 4) / 2,
                text_y=y - 4,
                tick=tick,
                tick_y=20 + COLUMN_AREA + 16,
            )
        )
    return Chart(
        key=key,
        title=title,
        note=note,
        bars=tuple(bars),
        width=30 + len(items) * COLUMN + 10,
        height=20 + COLUMN_AREA + 24,
        total=sum(v for _, v, _, _, _ in items),
        horizontal=False,
    )


def _list(model: str, **query: str) -> str:
    url = reverse(f"admin:durableruns_{model}_changelist")
    return f"{url}?{urlencode(query)}" if query else url


def runs_by_status(hidden: frozenset[str] = frozenset()) -> Chart:
    counts = dict(_runs(hidden).order_by().values_list("status").annotate(n=Count("pk")).values_list("status", "n"))
    items = [
        (label, counts.get(status, 0), _list("runstate", status__exact=status), STATUS_COLOURS[status])
        for status, label in RunStatus.choices
    ]
    return _rows("status", "Runs by status", "every run in the record", items)


def escalations_by_age(now: datetime, hidden: frozenset[str] = frozenset()) -> Chart:
    buckets: dict[str, Any] = {}
    younger_than = None
    for index, (_, limit, _) in enumerate(ESCALATION_AGES):
        condition = Q()
        if younger_than is not None:
            condition &= Q(opened_at__lte=now - younger_than)
        if limit is not None:
            condition &= Q(opened_at__gt=now - limit)
        buckets[f"b{index}"] = Count("pk", filter=condition)
        younger_than = limit
    open_ones = Escalation.objects.filter(decision__isnull=True)
    if hidden:
        open_ones = open_ones.exclude(run__workflow__in=sorted(hidden))
    counts = open_ones.order_by().aggregate(**buckets)
    queue = _list("escalation", state="open")
    items = [(label, int(counts[f"b{i}"] or 0), queue, colour) for i, (label, _, colour) in enumerate(ESCALATION_AGES)]
    return _rows("escalations", "Open escalations by age", "how long each has waited for a decision", items)


def throughput(now: datetime, hidden: frozenset[str] = frozenset()) -> Chart:
    tz = timezone.get_current_timezone()
    hour = timezone.localtime(now, tz).replace(minute=0, second=0, microsecond=0)
    hours = [hour - timedelta(hours=23 - i) for i in range(24)]
    done = (
        _runs(hidden)
        .filter(created_at__gte=now - timedelta(days=7), status=RunStatus.COMPLETED, updated_at__gte=hours[0])
        .order_by()
        .annotate(hour=Trunc("updated_at", "hour", tzinfo=tz))
        .values_list("hour")
        .annotate(n=Count("pk"))
        .values_list("hour", "n")
    )
    per_hour = {timezone.localtime(h, tz): n for h, n in done}
    completed = _list("runstate", status__exact=RunStatus.COMPLETED)
    items = [
        (
            f"{h:%H}:00-{(h + timedelta(hours=1)):%H}:00",
            per_hour.get(h, 0),
            completed,
            STATUS_COLOURS[RunStatus.COMPLETED],
            f"{h:%H}:00" if i % 6 == 0 else "",
        )
        for i, h in enumerate(hours)
    ]
    return _columns("throughput", "Runs completed per hour", "the last 24 hours, this site's time zone", items)


def in_doubt(now: datetime, hidden: frozenset[str] = frozenset()) -> Chart:
    counts = sorted(
        ((workflow, count) for workflow, count, _ in in_doubt_by_workflow(now) if workflow not in hidden),
        key=lambda item: (-item[1], item[0]),
    )
    items = [(workflow, count, _list("runstate", workflow__exact=workflow), "#dc2626") for workflow, count in counts]
    return _rows(
        "in_doubt", "Attempts in doubt by workflow", "started, no result, and no live worker holding the run", items
    )


def _runs(hidden: frozenset[str]) -> Any:
    return RunState.objects.exclude(workflow__in=sorted(hidden)) if hidden else RunState.objects.all()


def build(clock: Clock | None = None, *, hidden: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The dashboard's charts, read in six queries; without the runs of the workflows in `hidden` (those out of
    the viewer's scope, durableruns.scopes)."""
    now = (clock or Clock()).now()
    charts = [runs_by_status(hidden), escalations_by_age(now, hidden), throughput(now, hidden), in_doubt(now, hidden)]
    return {"charts": charts, "now": now}
