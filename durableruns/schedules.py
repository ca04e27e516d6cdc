"""Declared schedules and their slots: runs on a timetable, exactly one per slot whatever the number of workers.

`schedule(name, workflow, cron, ...)`, declared in a `workflows.py`, names a cron expression in a time zone. The
slots are computed here (cronsim parses the expression and follows Debian cron through daylight saving: a fixed
02:30 on the night the clock skips it runs at 03:00, once; in a repeated hour it runs once), on the database's
clock. Starting them is one commit per schedule (store.start_slots): under the schedule's row lock, the run of
each slot later than the last one recorded is created with the run_id `<name>@<slot in ISO 8601, UTC>` and the
latest becomes the last; the primary key refuses a slot's second run whatever happens. Every worker pass asks
(`start_due`), and a `--loop` worker's timetable thread (durableruns.worker.timetable) wakes for the next slot.

After downtime, `catch_up="latest"` starts only the latest slot missed, `"all"` every one (at most
DURABLERUNS_SCHEDULE_CATCH_UP_MAX, the latest ones; the rest are logged as skipped). A schedule's slots count
from when a worker first saw it: declaring one never starts the slots before it.

A schedule whose input its workflow refuses (INPUT_RULES: today its concurrency key) is one schedule's trouble:
a system check reports it (durableruns.E024), and at run time it is logged, skipped, and named by runs_health and
the admin's schedules page, while every other schedule and every run goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.utils import timezone as django_timezone

from durableruns import conf, store
from durableruns.errors import DeclarationError, DurableRunsError, InvalidInput, ResultNotJSON, UnknownWorkflow
from durableruns.registry import Workflow, get_workflow, startable_workflows, workflows

log = logging.getLogger("durableruns")

CATCH_UP = ("latest", "all")
NAME_MAX = 150  # run_schedule.name; "<name>@<slot>" must fit run_state.run_id (200)


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """A declared schedule: runs of `workflow` with `input`, one per slot of `cron` in `timezone`."""

    name: str
    workflow: str
    cron: str
    input: Mapping[str, Any] = field(default_factory=dict)
    timezone: str = "UTC"
    catch_up: str = "latest"

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def run_id(self, slot: datetime) -> str:
        """The run_id of the slot's run: the only one the database will take for that slot."""
        return f"{self.name}@{slot_text(slot)}"

    def next_slot(self, after: datetime) -> datetime:
        """The first slot strictly after `after` (aware), in UTC."""
        return next_slot(self.cron, self.zone, after)


_declared: dict[str, Schedule] = {}


def schedule(
    name: str,
    workflow: Any,
    cron: str,
    *,
    input: Mapping[str, Any] | None = None,
    timezone: str = "UTC",
    catch_up: str = "latest",
) -> Schedule:
    """Declare a schedule: one run of `workflow` (a Workflow or its name) per slot of `cron` in `timezone`.

    Refused at once (DeclarationError) for an expression cronsim cannot parse, an unknown time zone, a catch_up
    other than "latest" or "all", or input that is not a JSON object. Declaring the name again replaces it."""
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX or "@" in name:
        raise DeclarationError(f"schedule name {name!r}: a non-empty name of at most {NAME_MAX} characters, no '@'")
    workflow_name = workflow if isinstance(workflow, str) else getattr(workflow, "name", None)
    if not isinstance(workflow_name, str) or not workflow_name:
        raise DeclarationError(f"schedule {name}: workflow must be a Workflow or its name, not {workflow!r}")
    declared_already = workflows().get(workflow_name)
    if (isinstance(workflow, Workflow) and workflow.internal) or (declared_already and declared_already.internal):
        # Started only by the code that declares it (Workflow(internal=True)): a schedule is not that code.
        raise DeclarationError(f"schedule {name}: workflow {workflow_name!r} is internal; a schedule cannot start it")
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise DeclarationError(f"schedule {name}: unknown time zone {timezone!r}") from None
    try:
        CronSim(cron, datetime.now(zone))
    except (CronSimError, AttributeError, TypeError) as exc:
        raise DeclarationError(f"schedule {name}: cron expression {cron!r} is not valid: {exc}") from None
    if catch_up not in CATCH_UP:
        raise DeclarationError(f"schedule {name}: catch_up must be 'latest' or 'all', not {catch_up!r}")
    if input is not None and not isinstance(input, Mapping):
        raise DeclarationError(f"schedule {name}: input must be a JSON object (a dict)")
    try:  # refused now, not at 3 am
        store.to_json(dict(input or {}), what=f"the input of schedule {name}")
    except ResultNotJSON as exc:
        raise DeclarationError(str(exc)) from None
    declared = Schedule(
        name=name, workflow=workflow_name, cron=cron, input=dict(input or {}), timezone=timezone, catch_up=catch_up
    )
    _declared[name] = declared
    return declared


def schedules() -> tuple[Schedule, ...]:
    """Every declared schedule, by name."""
    return tuple(_declared[name] for name in sorted(_declared))


def get_schedule(name: str) -> Schedule | None:
    return _declared.get(name)


# -- the slots (pure) ----------------------------------------------------------------------------------------


def slot_text(slot: datetime) -> str:
    """A slot in ISO 8601, UTC, to the second: 2026-03-29T01:00:00Z (sorts as it happens)."""
    return slot.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def next_slot(cron: str, zone: ZoneInfo, after: datetime) -> datetime:
    """The first slot of `cron` in `zone` strictly after `after` (aware), in UTC."""
    start = after.astimezone(zone).replace(microsecond=0)  # the slots are whole seconds
    return next(CronSim(cron, start)).astimezone(UTC)


def slots_between(
    cron: str, zone: ZoneInfo, after: datetime, until: datetime, *, limit: int
) -> tuple[list[datetime], bool]:
    """The slots s with after < s <= until (aware datetimes), at most the latest `limit` of them, oldest first,
    in UTC; and whether earlier slots in that span were left out for the limit.

    Walked back from `until`, so a long outage costs `limit` steps, not one per slot missed."""
    found: list[datetime] = []
    # cronsim steps back before its first answer: start one second past `until` so a slot at `until` counts.
    walk = CronSim(cron, (until.astimezone(zone) + timedelta(seconds=1)).replace(microsecond=0), reverse=True)
    for slot in walk:
        slot = slot.astimezone(UTC)
        if slot > until:
            continue
        if slot <= after:
            return found[::-1], False
        if len(found) == limit:
            return found[::-1], True
        found.append(slot)
    return found[::-1], False


def due(declared: Schedule, *, after: datetime, now: datetime, cap: int) -> tuple[list[datetime], bool]:
    """The slots of `declared` to start at `now`, the last one started (or first seen) being `after`: the latest
    missed one ("latest") or every one up to `cap` ("all"); and whether missed slots are left unstarted."""
    limit = 1 if declared.catch_up == "latest" else max(1, cap)
    return slots_between(declared.cron, declared.zone, after, now, limit=limit)


# -- what a workflow asks of a schedule's input ------------------------------------------------------------

# Each rule asks the workflow about the schedule's input and raises InvalidInput if the workflow refuses it, as a
# start() of that input would be refused. Another rule of the input (a workflow's declared attributes) joins here.
INPUT_RULES: tuple[Callable[[Workflow, dict[str, Any]], object], ...] = (
    lambda workflow, input: workflow.limit_key(input),  # its concurrency key, read from the input
    lambda workflow, input: workflow.attributes_of(input),  # its declared attributes (durableruns.attributes)
)


def input_refused(declared: Schedule) -> str | None:
    """Why the schedule's workflow refuses its input (every slot's run would be refused), or None: the input
    passes every rule, or the workflow is not declared in this deploy (its own trouble, E023)."""
    try:
        workflow = get_workflow(declared.workflow)
    except UnknownWorkflow:
        return None
    for rule in INPUT_RULES:
        try:
            rule(workflow, dict(declared.input))
        except InvalidInput as exc:
            return str(exc)
    return None


# -- starting them ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Tick:
    """What one look at the timetable did: the runs it started, and the seconds until the next slot of any
    schedule (None: no schedule declared), from the database's clock as it read it."""

    started: tuple[str, ...] = ()
    next_in: float | None = None
    troubles: tuple[tuple[str, str], ...] = ()  # (schedule, what went wrong): each skipped, the others started


def start_due(*, clock: Any = None) -> Tick:
    """Start the run of every slot that has come, for every declared schedule; say when the next slot comes.

    Safe from any number of workers at once: each schedule's slots are started in one commit under its row lock,
    and the run_id of a slot is the database's guard against a second run of it. One schedule's trouble (an input
    its workflow refuses) is logged and skips that schedule only: its slots wait, unstarted, for a deploy that
    mends it (then `catch_up` says which start)."""
    if not _declared:
        return Tick()
    clock = clock or store.DATABASE
    now = aware(clock.now())
    known = store.schedule_marks([s.name for s in schedules()], now=now)
    started: list[str] = []
    upcoming: list[datetime] = []
    troubles: list[tuple[str, str]] = []
    for declared in schedules():
        upcoming.append(declared.next_slot(now))
        after = known[declared.name]
        slots, left_out = due(declared, after=after, now=now, cap=conf.schedule_catch_up_max())
        if slots:
            # An internal workflow declared after the schedule is refused here too: startable ones only.
            workflow = startable_workflows().get(declared.workflow)
            if workflow is None:
                log.error(
                    "schedule %s: workflow %r is not declared in this deploy; its slots wait for one that declares it",
                    declared.name,
                    declared.workflow,
                )
                continue
            if left_out:
                say = log.warning if declared.catch_up == "all" else log.info
                say(
                    "schedule %s: catch_up=%r starts %d slot(s) missed, %s to %s; the earlier ones since %s are "
                    "skipped",
                    declared.name,
                    declared.catch_up,
                    len(slots),
                    slot_text(slots[0]),
                    slot_text(slots[-1]),
                    slot_text(after),
                )
            try:
                refused = input_refused(declared)
                if refused is not None:
                    raise InvalidInput(refused)
                started += store.start_slots(
                    schedule=declared.name,
                    slots=[(s, declared.run_id(s)) for s in slots],
                    workflow=workflow.name,
                    plan=workflow.as_plan(),
                    input=dict(declared.input),
                    clock=clock,
                    concurrency_key=workflow.limit_key(dict(declared.input)),
                    deadline=workflow.deadline,  # counted from the slot's start (durableruns.deadlines)
                    on_deadline=workflow.on_deadline if workflow.deadline is not None else None,
                    attributes=workflow.attributes_of(dict(declared.input)),
                )
            except DurableRunsError as exc:  # this schedule's own trouble: the others go on
                troubles.append((declared.name, str(exc)))
                log.error(
                    "schedule %s: slot %s not started: %s; the other schedules go on, this one's slots wait for a "
                    "deploy that mends it",
                    declared.name,
                    slot_text(slots[-1]),
                    exc,
                )
    next_in = (min(upcoming) - now).total_seconds() if upcoming else None
    return Tick(started=tuple(started), next_in=next_in, troubles=tuple(troubles))


def aware(value: datetime) -> datetime:
    """A datetime of the database's clock as an aware one (Django gives naive ones when USE_TZ is off)."""
    if django_timezone.is_aware(value):
        return value
    return django_timezone.make_aware(value, django_timezone.get_default_timezone())
