"""Health checks for monitoring: what an on-call engineer must hear about, as problems with a level.

Each check reads the record with a cheap query (the active runs through run_state_active_idx, open escalations
through their queue) and measures every age by the database's clock, read once (`Clock().now()`), against times
the database itself recorded; no host's clock is compared with them. The one check that looks at this host's
clock is the skew check, whose point is exactly that comparison.

The levels follow monitoring plugins: 0 ok, 1 warning, 2 critical; a report's status is its worst problem's.
The workers' own reports (run_worker, written by each resume_runs process every few seconds) tell which live
workers fell back to polling because their listener was lost, and how far each one's clock is from the
database's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import IntEnum
from typing import Any

from django.db import connections
from django.db.models import Case, Count, DateTimeField, F, Min, When

from durableruns import conf
from durableruns.clock import Clock, host_skew
from durableruns.distribution import DROPPED_TRIGGERS, is_distributed
from durableruns.errors import UnknownWorkflow
from durableruns.models import Escalation, RunState, RunStatus, RunStep, StepStatus, WorkerPresence
from durableruns.ops import replication
from durableruns.passes import step_timeout
from durableruns.plans import STOPPED_MARK
from durableruns.registry import get_workflow
from durableruns.worker.pool import REFUSED_MARK

CHECKS = ("escalation", "stopped", "due", "stuck", "skew")
SKIPPED: dict[str, str] = {}
# A worker reports itself every few seconds (durableruns.worker.presence); one silent longer than this is gone.
LIVE_WITHIN = timedelta(seconds=60)


class Level(IntEnum):
    OK = 0
    WARNING = 1
    CRITICAL = 2


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    warning: timedelta
    critical: timedelta

    def level(self, age: timedelta) -> Level:
        if age >= self.critical:
            return Level.CRITICAL
        if age >= self.warning:
            return Level.WARNING
        return Level.OK


@dataclass(frozen=True, kw_only=True)
class Problem:
    check: str
    level: Level
    message: str
    count: int = 1
    oldest_seconds: float | None = None
    runs: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()  # each run's reason, where the check reads them (stopped)

    def line(self) -> str:
        return f"{self.level.name} {self.check}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "level": self.level.name.lower(),
            "message": self.message,
            "count": self.count,
            "oldest_seconds": self.oldest_seconds,
            "runs": list(self.runs),
            **({"reasons": dict(zip(self.runs, self.reasons, strict=True))} if self.reasons else {}),
        }


@dataclass(kw_only=True)
class HealthReport:
    checked_at: datetime
    problems: list[Problem] = field(default_factory=list)
    skew_seconds: float | None = None
    skipped: dict[str, str] = field(default_factory=lambda: dict(SKIPPED))

    @property
    def status(self) -> Level:
        return max((p.level for p in self.problems), default=Level.OK)

    def lines(self) -> list[str]:
        if not self.problems:
            return [
                f"OK durableruns: no problem (checked at {self.checked_at:%Y-%m-%d %H:%M:%S}, the database's clock)"
            ]
        return [p.line() for p in sorted(self.problems, key=lambda p: (-p.level, p.check))]

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status.name.lower(),
            "exit": int(self.status),
            "checked_at": self.checked_at.isoformat(),
            "skew_seconds": self.skew_seconds,
            "problems": [p.as_dict() for p in sorted(self.problems, key=lambda p: (-p.level, p.check))],
            "skipped": self.skipped,
        }


def thresholds(check: str) -> Thresholds:
    warning, critical = conf.health_thresholds(check)
    return Thresholds(warning=warning, critical=critical)


def age_text(age: timedelta) -> str:
    """An age as people read it: 3d 4h, 2h 5m, 7m 12s, 40s."""
    seconds = int(max(age.total_seconds(), 0))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {seconds}s"
    return f"{seconds}s"


def check(*, limits: dict[str, Thresholds] | None = None, clock: Clock | None = None) -> HealthReport:
    """Run every check; `limits` overrides the settings' thresholds per check (escalation, due, stuck, skew)."""
    chosen = {name: thresholds(name) for name in CHECKS}
    chosen.update(limits or {})
    now = (clock or Clock()).now()
    report = HealthReport(checked_at=now)
    for found in (
        check_escalations(now, chosen["escalation"]),
        check_stopped(now, chosen["stopped"]),
        check_due(now, chosen["due"]),
        check_stuck(now, chosen["stuck"]),
    ):
        report.problems.extend(found)
    skew = host_skew()
    report.skew_seconds = round(skew.total_seconds(), 6)
    report.problems.extend(check_skew(skew, chosen["skew"]))
    report.problems.extend(check_workers(now, chosen["skew"]))
    report.problems.extend(check_replication())
    report.problems.extend(check_triggers())
    report.problems.extend(check_schedules())
    return report


def check_schedules() -> list[Problem]:
    """Critical for each declared schedule whose input its workflow refuses: its slots are skipped (the other
    schedules go on), so no run of it starts until a deploy mends it. Read from this deploy's declarations, the
    same rules every look at the timetable applies (schedules.INPUT_RULES)."""
    from durableruns import schedules

    refused = [(s.name, why) for s in schedules.schedules() if (why := schedules.input_refused(s)) is not None]
    if not refused:
        return []
    named = "; ".join(f"{name}: {why}" for name, why in refused)
    return [
        Problem(
            check="schedules",
            level=Level.CRITICAL,
            count=len(refused),
            message=f"{len(refused)} schedule(s) start no run, their workflow refusing their input: {named}",
        )
    ]


# The triggers on run_state the record relies on (migrations 0018 and 0019), by database, and what stops without
# each. A restore that left them out (a data-only dump, a table copied by hand) or a trigger disabled leaves the
# runs moving while these quietly stop: the check names them.
TRIGGERS = {
    "run_state_count_insert": "the finished runs' counts (metrics, dashboard)",
    "run_state_count_update": "the finished runs' counts (metrics, dashboard)",
    "run_state_count_delete": "the finished runs' counts after a prune",
    "run_state_count_truncate": "the finished runs' counts after a TRUNCATE",
    "run_state_slot_freed": "letting parked runs go when a slot of their concurrency limit frees: they stay parked",
    "run_state_slot_let_go": "letting a parked run go when a cancelled run's worker lets go of its slot: it waits "
    "for that lease to run out",
    "run_state_ended": "durableruns.result() hearing that a run ended: it waits out its timeout",
    "run_state_wake_by_deadline": "a waiting run waking at its deadline: it sleeps past it, until its own wake time",
}
SQLITE_TRIGGER_NAMES = ("run_state_count_insert", "run_state_count_update")  # SQLite keeps the counts only


def check_triggers() -> list[Problem]:
    """Critical when a trigger the record relies on is missing from run_state, or disabled."""
    db = connections[conf.database()]
    with db.cursor() as cursor:
        if db.vendor == "postgresql":
            cursor.execute(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = 'run_state'::regclass AND NOT tgisinternal "
                "AND tgenabled <> 'D'"
            )
            expected: tuple[str, ...] = tuple(TRIGGERS)
            if is_distributed(conf.database()):  # distribute_runs dropped the others (durableruns.distribution)
                expected = tuple(name for name in TRIGGERS if name not in DROPPED_TRIGGERS)
        elif db.vendor == "sqlite":
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'run_state'")
            expected = SQLITE_TRIGGER_NAMES
        else:
            return []
        present = {name for (name,) in cursor.fetchall()}
    missing = [name for name in expected if name not in present]
    if not missing:
        return []
    stopped = "; ".join(f"{name}: {TRIGGERS[name]}" for name in missing)
    return [
        Problem(
            check="triggers",
            level=Level.CRITICAL,
            count=len(missing),
            message=f"{len(missing)} trigger(s) on run_state missing or disabled, so these stopped: "
            f"{stopped}. Restore them from the schema (migrations 0018 and 0019)",
        )
    ]


def check_replication() -> list[Problem]:
    """A warning when a failover could lose a commit PostgreSQL acknowledged (durableruns.ops.replication)."""
    risk = replication.risk_now()
    return [] if risk is None else [Problem(check="replication", level=Level.WARNING, message=risk)]


def check_workers(now: datetime, skew_limits: Thresholds) -> list[Problem]:
    """Live workers (reported within LIVE_WITHIN, not stopped) that poll because their listener was lost or no
    notification reaches it (a pooler in between: a warning, runs are picked up at the poll interval, not at once),
    and those whose clock is off by the skew thresholds (as they measured it against the database)."""
    live = list(WorkerPresence.objects.filter(stopped_at__isnull=True, seen_at__gte=now - LIVE_WITHIN))
    problems = []
    lost = [w for w in live if w.pickup.startswith(("polling (listener lost", "polling (notifications do not"))]
    if lost:
        named = ", ".join(f"{w.name} ({w.pickup})" for w in lost)
        problems.append(
            Problem(
                check="listener",
                level=Level.WARNING,
                count=len(lost),
                message=f"{len(lost)} worker(s) fell back to polling: {named}",
            )
        )
    for worker in live:
        if worker.skew_seconds is None:
            continue
        skew = timedelta(seconds=worker.skew_seconds)
        level = skew_limits.level(abs(skew))
        if level is not Level.OK:
            side = "ahead of" if worker.skew_seconds > 0 else "behind"
            problems.append(
                Problem(
                    check="skew",
                    level=level,
                    oldest_seconds=worker.skew_seconds,
                    message=f"worker {worker.name}'s clock is {abs(worker.skew_seconds):.1f}s {side} the database's "
                    f"(check NTP on that host)",
                )
            )
    return problems


def check_escalations(now: datetime, limits: Thresholds) -> list[Problem]:
    """Escalations nobody has decided for longer than the warning threshold."""
    waiting = Escalation.objects.open().filter(opened_at__lte=now - limits.warning)
    stats = waiting.aggregate(count=Count("pk"), oldest=Min("opened_at"))
    if not stats["count"]:
        return []
    oldest = waiting.order_by("opened_at").first()
    if oldest is None:  # decided between the count and this read: nothing waits any more
        return []
    age = now - stats["oldest"]
    return [
        Problem(
            check="escalation",
            level=limits.level(age),
            count=stats["count"],
            oldest_seconds=age.total_seconds(),
            runs=tuple(waiting.values_list("run_id", flat=True)[:20]),
            message=f"{stats['count']} escalation(s) open longer than {age_text(limits.warning)}; oldest "
            f"{age_text(age)}: run {oldest.run_id}, step {oldest.step} (decide it in the admin's "
            f"escalation queue)",
        )
    ]


# Why a run stopped for staff with no escalation, as its reason says it; the first that matches names it.
STOP_KINDS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("crash_budget", lambda reason: "the crash budget of" in reason),
    ("lookup_budget", lambda reason: reason.startswith("the lookup of ") and " times in a row" in reason),
    ("lacking_steps", lambda reason: reason.startswith(STOPPED_MARK)),
    ("data_refused", lambda reason: reason.startswith(REFUSED_MARK)),
)


def stop_kind(reason: str) -> str:
    """Name why a run stopped for staff (crash_budget, lookup_budget, lacking_steps, data_refused, or other),
    from its reason: what the metrics label it with and runs_health counts by."""
    return next((kind for kind, matches in STOP_KINDS if matches(reason)), "other")


def check_stopped(now: datetime, limits: Thresholds) -> list[Problem]:
    """Runs stopped for staff with no escalation open, longer than the warning threshold (at once by default):
    the escalation queue does not list them and nothing else asks anyone to retry or cancel them. Each is named
    with its reason (the oldest's in the line, every one's in the JSON)."""
    stopped = list(
        RunState.objects.stopped_unasked()
        .filter(updated_at__lte=now - limits.warning)
        .order_by("updated_at")
        .values_list("run_id", "updated_at", "reason")
    )
    if not stopped:
        return []
    run_id, since, reason = stopped[0]
    age = now - since
    kinds: dict[str, int] = {}
    for _, _, each in stopped:
        kinds[stop_kind(each)] = kinds.get(stop_kind(each), 0) + 1
    counted = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in sorted(kinds.items()))
    return [
        Problem(
            check="stopped",
            level=limits.level(age),
            count=len(stopped),
            oldest_seconds=age.total_seconds(),
            runs=tuple(r for r, _, _ in stopped[:20]),
            reasons=tuple(each for _, _, each in stopped[:20]),
            message=f"{len(stopped)} run(s) stopped for staff with no escalation ({counted}); oldest stopped "
            f"{age_text(age)} ago: run {run_id}: {_short(reason)} (retry or cancel it in the admin)",
        )
    ]


def _short(reason: str, limit: int = 300) -> str:
    line = " ".join(reason.split())
    return line if len(line) <= limit else f"{line[:limit]}..."


def _due_since() -> Case:
    """When a due run became due: a pending run at its last change (created, decided, retried), a waiting one at
    its wake time, a running one when its lease expired."""
    return Case(
        When(status=RunStatus.PENDING, then=F("updated_at")),
        When(status=RunStatus.WAITING, then=F("wake_at")),
        default=F("lease_expires_at"),
        output_field=DateTimeField(),
    )


def check_due(now: datetime, limits: Thresholds) -> list[Problem]:
    """Runs due longer than the warning threshold: no worker is taking them."""
    overdue = RunState.objects.due(now).annotate(due_since=_due_since()).filter(due_since__lte=now - limits.warning)
    stats = overdue.aggregate(count=Count("pk"), oldest=Min("due_since"))
    if not stats["count"]:
        return []
    age = now - stats["oldest"]
    by_status = dict(overdue.order_by().values_list("status").annotate(n=Count("pk")).values_list("status", "n"))
    kinds = ", ".join(f"{n} {status}" for status, n in sorted(by_status.items()))
    oldest = overdue.order_by("due_since").values_list("run_id", flat=True)[:20]
    return [
        Problem(
            check="due",
            level=limits.level(age),
            count=stats["count"],
            oldest_seconds=age.total_seconds(),
            runs=tuple(oldest),
            message=f"{stats['count']} run(s) due for longer than {age_text(limits.warning)} ({kinds}); "
            f"oldest due for {age_text(age)}: is any resume_runs worker running?",
        )
    ]


def _timeout_of(workflow: str, step: str) -> timedelta:
    try:
        return step_timeout(get_workflow(workflow)[step])
    except (UnknownWorkflow, KeyError):
        return conf.default_timeout()


def check_stuck(now: datetime, limits: Thresholds) -> list[Problem]:
    """Runs held under a live lease whose step in hand started longer ago than its timeout plus the warning
    margin: a worker is alive (it renews the lease) but its step's call does not return."""
    in_hand = RunStep.objects.filter(
        status=StepStatus.STARTED, run__status=RunStatus.RUNNING, run__lease_expires_at__gte=now, epoch=F("run__epoch")
    ).values_list("run_id", "run__workflow", "run__owner", "step", "started_at")
    stuck: list[tuple[timedelta, str, str, str, timedelta]] = []
    for run_id, workflow, owner, step, started_at in in_hand:
        timeout = _timeout_of(workflow, step)
        past = now - started_at - timeout
        if past >= limits.warning:
            stuck.append((past, run_id, owner, step, timeout))
    if not stuck:
        return []
    stuck.sort(reverse=True)
    past, run_id, owner, step, timeout = stuck[0]
    return [
        Problem(
            check="stuck",
            level=limits.level(past),
            count=len(stuck),
            oldest_seconds=past.total_seconds(),
            runs=tuple(r for _, r, _, _, _ in stuck[:20]),
            message=f"{len(stuck)} run(s) running longer than their step's timeout plus "
            f"{age_text(limits.warning)}; worst: run {run_id}, step {step}, {age_text(past)} past "
            f"its {age_text(timeout)} timeout, held by {owner}",
        )
    ]


def check_skew(skew: timedelta, limits: Thresholds) -> list[Problem]:
    """This host's clock against the database's. durableruns decides by the database's clock alone, so runs stay
    safe, but a host this far off has broken time synchronisation (its logs, its cron)."""
    off = abs(skew)
    level = limits.level(off)
    if level is Level.OK:
        return []
    side = "ahead of" if skew > timedelta(0) else "behind"
    return [
        Problem(
            check="skew",
            level=level,
            oldest_seconds=skew.total_seconds(),
            message=f"this host's clock is {off.total_seconds():.1f}s {side} the database's (check NTP)",
        )
    ]
