"""The only module that writes the record. One durable transaction per fact, each fenced on the run's epoch.

A worker's writes are conditional updates `WHERE run_id = ... AND epoch = <its epoch>`, issued first in each
transaction: on PostgreSQL the update takes the row lock, so a concurrent claim either committed before (zero
rows: FencedOut, nothing written) or waits until this fact is committed. A step's row moves forward once,
started -> completed or failed, by a conditional update on its status.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DataError, IntegrityError, connections, transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone as django_timezone

from durableruns import conf, pgsql, signals
from durableruns.boundary import StepAttempt, compute_boundary
from durableruns.clock import Clock, as_django, on_postgresql
from durableruns.errors import (
    AlreadyDecided,
    ApprovalNotFound,
    DuplicateRun,
    FencedOut,
    InvalidInput,
    ResultNotJSON,
    RunNotActionable,
    RunNotFound,
    UnknownWorkflow,
)
from durableruns.holdings import RELEASE_SUFFIX, assess, given_back, needs_releasing
from durableruns.models import (
    Escalation,
    Intervention,
    Resolution,
    RunEvent,
    RunPlan,
    RunState,
    RunStatus,
    RunStep,
    ScheduleState,
    StepStatus,
    WorkerPresence,
)
from durableruns.plans import Plan, attempted_in_order, check_fit, lacking
from durableruns.registry import FirstSteps, generation, get_workflow, limits, workflows


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A worker's claim on a run; `epoch` fences every write it makes."""

    run_id: str
    owner: str
    epoch: int
    seconds: float

    @property
    def duration(self) -> timedelta:
        return timedelta(seconds=self.seconds)


# Outside tests the database's clock as it is; every time a function here records or compares is taken from it.
DATABASE = Clock()


@dataclass(frozen=True, kw_only=True)
class Claimed:
    """What a claim hands the engine: the lease and the run's immutable facts."""

    lease: Lease
    workflow: str
    plan_fingerprint: str
    input: dict[str, Any]
    attempts: list[StepAttempt] | None = None  # read with the claim where the database allows
    first_intent: Intent | None = None  # the first step's intent, when it rode on the claim's commit
    ending: str = ""  # set while the run gives back what it holds: the status it reaches afterwards
    trace_context: dict[str, str] | None = None  # the trace the run continues (durableruns.tracing)


@dataclass(frozen=True, kw_only=True)
class Intent:
    """A step about to act: the started row to commit before it does."""

    step: str
    attempt: int
    effect_key: str
    cursor: int
    loop_cursor: int = 0
    progress: dict[str, Any] | None = None
    wait_for_standby: bool = False  # its commit waits for a standby, with DURABLERUNS_STANDBY_INTENTS


_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def to_json(value: Any, *, what: str) -> str:
    """Encode `value` as JSON text PostgreSQL's jsonb can store, or raise ResultNotJSON naming what it was."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")  # a lone surrogate cannot be stored
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise ResultNotJSON(f"{what} is not JSON ({type(value).__name__}): {exc}") from None
    if _NUL.search(text):
        raise ResultNotJSON(f"{what} contains a NUL character (\\u0000), which jsonb cannot store")
    return text


def ensure_json(value: Any, *, what: str) -> Any:
    """Return `value` if it round-trips through JSON, else raise ResultNotJSON naming what it was."""
    to_json(value, what=what)
    return value


# Past this, an error text or a reason is cut (with a marker): a traceback's repr of a huge value must not bloat
# the record or the admin page.
TEXT_LIMIT = 10_000
# The reason of a run started with a run_after: waiting, with that time as its wake time, until it is due.
DEFERRED = "deferred: not due before its wake time"


def storable(text: str, *, limit: int = TEXT_LIMIT) -> str:
    """`text` as PostgreSQL can store it: NUL characters (which no text column holds) and lone surrogates (which
    are not UTF-8) replaced, and cut to `limit` characters with a marker saying how much was cut."""
    text = text.replace("\x00", "\\0")
    text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) > limit:
        text = f"{text[:limit]}... [cut: {len(text) - limit} more characters]"
    return text


def _wake_workers() -> None:
    """Wake idle workers when this transaction commits (PostgreSQL; elsewhere they poll)."""
    if connections[conf.database()].vendor == "postgresql":
        pgsql.wake_workers()


def _fast() -> bool:
    """Use the one-statement PostgreSQL path; a statement outside any transaction is its own commit."""
    db = connections[conf.database()]  # one lookup of this thread's connection, not one per attribute
    if db.vendor != "postgresql":
        return False
    if db.in_atomic_block:
        raise RuntimeError("durableruns records each fact in its own transaction: call it outside atomic()")
    return True


def _times(lease: Lease, clock: Clock) -> dict[str, timedelta]:
    """What the hot path's statements add to the database's now(): the clock's shift and the lease."""
    return {"shift": clock.shift, "lease": lease.duration}


def _fence(lease: Lease, clock: Clock, **fields: Any) -> None:
    moved = RunState.objects.filter(pk=lease.run_id, epoch=lease.epoch).update(
        updated_at=clock.expression(), lease_expires_at=clock.expression(lease.duration), **fields
    )
    if not moved:
        raise FencedOut(run_id=lease.run_id, epoch=lease.epoch)


def _insert_intent(lease: Lease, intent: Intent, clock: Clock) -> None:
    RunStep.objects.create(
        run_id=lease.run_id,
        step=intent.step,
        attempt=intent.attempt,
        status=StepStatus.STARTED,
        effect_key=intent.effect_key,
        started_at=clock.expression(),
        held_until=clock.expression(lease.duration),
        owner=lease.owner,
        epoch=lease.epoch,
        loop_cursor=intent.loop_cursor,
        progress=intent.progress or {},
    )


def _finish(lease: Lease, step: str, attempt: int, **fields: Any) -> None:
    moved = RunStep.objects.filter(
        run_id=lease.run_id, step=step, attempt=attempt, status=StepStatus.STARTED
    ).update(**fields)
    if not moved:
        raise FencedOut(
            f"attempt {attempt} of {step} is no longer started", run_id=lease.run_id, epoch=lease.epoch
        )


# How many runs one claim may park before it gives up for now (each parked run is out of every probe after).
_PARKS_PER_CLAIM = 100


def _limits_json() -> str | None:
    """This deploy's concurrency limits as the claim takes them (JSON: workflow -> limit), or None if it has none:
    then the claim is the statement without limits."""
    bounds = limits()
    return _limits_json_for(tuple(sorted(bounds.items()))) if bounds else None


@functools.lru_cache(maxsize=16)
def _limits_json_for(bounds: tuple[tuple[str, int], ...]) -> str:
    return json.dumps(dict(bounds))


def _first_steps_json(first_steps: FirstSteps) -> str:
    return _first_steps_json_for(first_steps, conf.standby_intents() is not None)


@functools.lru_cache(maxsize=16)
def _first_steps_json_for(first_steps: FirstSteps, standby: bool) -> str:
    # A first step whose intent waits for a standby does not ride on the claim's commit (the claim's own
    # transaction keeps the server's level): its intent is recorded on its own, with the level it needs.
    return json.dumps([{"workflow": w, "fingerprint": f, "step": s} for w, f, s in first_steps
                       if not (standby and get_workflow(w)[s].waits_for_standby)])


def _standby_level(intent: Intent | None) -> str | None:
    """The synchronous_commit level `intent`'s commit is made with, if not the server's own."""
    if intent is None or not intent.wait_for_standby:
        return None
    return conf.standby_intents()


def _wait_for_standby(level: str | None) -> None:
    """Inside the ORM's transaction about to commit an intent: make its commit wait at `level` (SET LOCAL: this
    transaction only; PostgreSQL reads it when it commits). The one-statement path: pgsql._waiting_for_standby."""
    db = connections[conf.database()]
    if level is not None and db.vendor == "postgresql":
        with db.cursor() as cursor:
            cursor.execute("SELECT set_config('synchronous_commit', %s, true)", [level])


def _decoded(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _attempt(row: dict[str, Any]) -> StepAttempt:
    """An attempt as json_build_object returned it (timestamps as ISO text)."""
    for when in ("started_at", "finished_at"):
        if row[when] is not None:
            row[when] = datetime.fromisoformat(row[when])
    for when in ("renewed_at", "held_until", "raised_at"):
        row[when] = datetime.fromisoformat(row[when]) if row.get(when) else None
    row["progress"] = row["progress"] or {}
    return StepAttempt(**row)


def schedule_marks(names: list[str], *, now: datetime) -> dict[str, datetime]:
    """Per schedule, the moment its next slots count from: its last slot started, or when a worker first saw it.
    A schedule seen for the first time is recorded now (`now`: the database's time, read by the caller), so the
    slots before it are never started. Aware datetimes."""
    def read() -> dict[str, datetime]:
        rows = ScheduleState.objects.filter(name__in=names).values_list("name", "last_slot", "created_at")
        return {name: _aware(last or created) for name, last, created in rows}

    marks = read()
    if len(marks) == len(names):  # every look but a new schedule's first: one read
        return marks
    stamp = _stored(now)
    ScheduleState.objects.bulk_create(
        [ScheduleState(name=name, last_slot=None, created_at=stamp, updated_at=stamp) for name in names
         if name not in marks],
        ignore_conflicts=True)  # another worker may record it first: its moment stands
    return read()


def start_slots(*, schedule: str, slots: list[tuple[datetime, str]], workflow: str, plan: Plan,
                input: dict[str, Any], clock: Clock = DATABASE, concurrency_key: str | None = None) -> list[str]:
    """Start the run of each (slot, run_id) later than the schedule's last slot, and record the latest as its
    last, in one commit under the schedule's row lock; return the run_ids started.

    Workers racing for the same slots queue on the lock, and the one that comes second finds them recorded. A
    slot's run that exists already (its run_id is the slot's) is never started twice: the primary key refuses it.
    """
    started: list[str] = []
    with transaction.atomic(using=conf.database(), durable=True):
        row = ScheduleState.objects.select_for_update().filter(pk=schedule).values_list("last_slot", flat=True)
        last = _aware(row[0]) if row and row[0] is not None else None
        fresh = [(slot, run_id) for slot, run_id in slots if last is None or slot > last]
        if not fresh:
            return started
        for _, run_id in fresh:
            try:
                create_run(run_id=run_id, workflow=workflow, plan_fingerprint=plan.fingerprint, input=input,
                           clock=clock, plan=plan, concurrency_key=concurrency_key)
            except DuplicateRun:
                continue
            started.append(run_id)
        ScheduleState.objects.filter(pk=schedule).update(last_slot=_stored(max(slot for slot, _ in fresh)),
                                                         updated_at=clock.expression())
    return started


def _stored(value: datetime) -> datetime:
    """An aware datetime as Django stores it: aware with USE_TZ, else naive in the default time zone."""
    if settings.USE_TZ:
        return value
    return django_timezone.make_naive(value, django_timezone.get_default_timezone())


def _aware(value: datetime) -> datetime:
    if django_timezone.is_aware(value):
        return value
    return django_timezone.make_aware(value, django_timezone.get_default_timezone())


def report_presence(name: str, *, threads: int, pickup: str, skew_seconds: float | None, runs_in_hand: int,
                    stopped: bool = False, clock: Clock = DATABASE) -> None:
    """Record how a worker process stands now (seen at the database's now), for health checks; a row per name."""
    fields: dict[str, Any] = {
        "threads": threads, "pickup": storable(pickup, limit=450), "skew_seconds": skew_seconds,
        "runs_in_hand": runs_in_hand, "seen_at": clock.expression(),
        "stopped_at": clock.expression() if stopped else None}
    if WorkerPresence.objects.filter(pk=name).update(**fields):
        return
    try:
        with transaction.atomic(using=conf.database()):
            WorkerPresence.objects.create(name=name, started_at=clock.expression(), **fields)
    except IntegrityError:  # another process of the same name reported first
        WorkerPresence.objects.filter(pk=name).update(**fields)


# The workflow name of measure_loop's scratch runs: never registered, so no worker can run one.
SCRATCH_WORKFLOW = "durableruns.measure_loop (scratch run)"


def delete_scratch_run(run_id: str) -> None:
    """Delete a measuring scratch run and its attempts; a real run is never deleted, whatever the id."""
    RunState.objects.filter(pk=run_id, workflow=SCRATCH_WORKFLOW).delete()


def _intent_params(intent: Intent) -> dict[str, Any]:
    progress = to_json(intent.progress, what="progress") if intent.progress else "{}"
    return {"i_step": intent.step, "i_attempt": intent.attempt, "i_key": intent.effect_key,
            "i_loop": intent.loop_cursor, "i_progress": progress}


# -- plans -----------------------------------------------------------------------------------------------------

# The fingerprints this process knows are recorded (so a start costs one statement, not two), and the plans it
# has read (a recorded plan never changes). Forgotten when the tables are flushed (apps.py, post_migrate).
_recorded: set[str] = set()
_read: dict[str, Plan] = {}


def forget_plans(**kwargs: Any) -> None:
    """Forget which plans are recorded: the tables were emptied (a flush emits post_migrate)."""
    _recorded.clear()
    _read.clear()


def record_plan(plan: Plan, *, clock: Clock = DATABASE) -> None:
    """Record `plan` under its fingerprint unless this process knows it is recorded: INSERT ... ON CONFLICT DO
    NOTHING, so any number of processes may race to record the same plan. Inside a transaction it joins it, and
    the process remembers it only once that commits (a rolled-back start leaves no plan behind)."""
    if plan.fingerprint in _recorded:
        return
    RunPlan.objects.bulk_create(
        [RunPlan(fingerprint=plan.fingerprint, workflow=plan.workflow, steps=[list(s) for s in plan.steps],
                 first_seen=clock.expression())],
        ignore_conflicts=True)
    alias = conf.database()
    if connections[alias].in_atomic_block:
        transaction.on_commit(lambda: _recorded.add(plan.fingerprint), using=alias)
    else:
        _recorded.add(plan.fingerprint)


def plan_of(workflow: str, fingerprint: str) -> Plan | None:
    """The plan a run of `workflow` started under (by its recorded fingerprint), or None if it is not recorded.

    This deploy's own plan of the workflow is the same plan when the fingerprints agree (the fingerprint is the
    hash of the steps), so that case costs no query; any other is read once per process."""
    try:
        current = get_workflow(workflow)
    except UnknownWorkflow:
        current = None
    if current is not None and current.fingerprint == fingerprint:
        return current.as_plan()
    plan = _read.get(fingerprint)
    if plan is None:
        row = RunPlan.objects.filter(pk=fingerprint).first()
        if row is None:
            return None
        plan = _read[fingerprint] = row.to_plan()
    return plan


def create_run(*, run_id: str, workflow: str, plan_fingerprint: str, input: dict[str, Any],
               clock: Clock = DATABASE, plan: Plan | None = None, trace_context: dict[str, str] | None = None,
               priority: int = 0, queue: str = "default", run_after: datetime | None = None,
               concurrency_key: str | None = None) -> None:
    """Record a pending run, created at the database's now; a worker picks it up (with `run_after`, a run
    waiting until then: the claim compares it with the database's now). `plan`, the run's plan, is recorded with
    it the first time this process starts a run of that fingerprint. `trace_context`: the trace the run's passes
    continue (durableruns.tracing), if one was current. `concurrency_key`: the key the run counts under for its
    workflow's concurrency limit ("" for the whole workflow), or None for a workflow without one.

    One INSERT (on PostgreSQL outside a transaction, the hot path's prepared one). Inside the caller's transaction
    it joins it (behind a savepoint, so a duplicate does not break it): the run then exists exactly when the
    caller's own records do.
    """
    deferred = "" if run_after is None else DEFERRED
    fields = {"run_id": run_id, "workflow": workflow, "plan_fingerprint": plan_fingerprint, "input": input,
              "status": RunStatus.PENDING if run_after is None else RunStatus.WAITING, "wake_at": run_after,
              "reason": deferred, "priority": priority, "queue": queue, "concurrency_key": concurrency_key,
              "created_at": clock.expression(), "updated_at": clock.expression(), "trace_context": trace_context}
    try:
        if connections[conf.database()].in_atomic_block:
            with transaction.atomic(using=conf.database()):
                if plan is not None:
                    record_plan(plan, clock=clock)
                RunState.objects.create(**fields)
                _wake_workers()  # on the caller's commit: a run rolled back wakes nobody
        else:
            if plan is not None:
                record_plan(plan, clock=clock)  # its own commit, once per fingerprint and process
            if _fast():
                pgsql.create_run(run=run_id, workflow=workflow, fingerprint=plan_fingerprint,
                                 input=to_json(input, what="the input"),
                                 trace=None if trace_context is None else to_json(trace_context, what="the trace"),
                                 priority=priority, queue=queue, wake_at=run_after, deferred=deferred,
                                 concurrency_key=concurrency_key)
            else:
                RunState.objects.create(**fields)
    except IntegrityError:
        raise DuplicateRun(run_id=run_id) from None
    signals.send_on_commit(signals.run_started, RunState, run_id=run_id, workflow=workflow)  # signals


def claim(*, owner: str, lease_seconds: float, clock: Clock = DATABASE, run_id: str | None = None,
          first_steps: FirstSteps = (), before_first_intent: Callable[[str], None] | None = None,
          hints: bool = False, queues: tuple[str, ...] = (), skip: Collection[str] = ()) -> Claimed | None:
    """Take the due run of highest priority, the oldest among equals (or `run_id`, if it is not held under a
    live lease); bump its epoch. With `queues`, only a run on one of those queues (a named `run_id` is taken
    whatever its queue). Runs in `skip` are left out: a single pass's runs it left due again at once
    (worker.pool), so it does not spin on them. A run of a workflow with a concurrency limit is taken only while
    its (workflow, key) has a slot free; on PostgreSQL one refused is parked (durableruns.pgsql, _CLAIMED_LIMITED)
    and the claim looks again, at most _PARKS_PER_CLAIM times.

    The first time this process (this deploy) finds nothing due, it first makes workable again the runs stopped
    for lacking steps this deploy has (reopen_runnable), and looks once more: a deploy that has the steps came
    back, and its first idle moment, not its first claim, pays for the look. A long-lived worker (--loop) looks
    again when idle every DURABLERUNS_MISSING_STEP_RETRY_SECONDS, for runs another deploy's workers stopped since.
    """
    taken = _claim(owner=owner, lease_seconds=lease_seconds, clock=clock, run_id=run_id, first_steps=first_steps,
                   before_first_intent=before_first_intent, hints=hints, queues=queues, skip=skip)
    if taken is None and run_id is None and _reopen_when_due(clock):
        taken = _claim(owner=owner, lease_seconds=lease_seconds, clock=clock, run_id=None, first_steps=first_steps,
                       before_first_intent=before_first_intent, hints=hints, queues=queues, skip=skip)
    return taken


# The registry generation (this process's deploy) that last looked for runs to reopen, and when (this process's
# monotonic clock: it only paces the looks; whether a run is reopened is decided from the record).
_reopened: tuple[int, float] | None = None


def _reopen_when_due(clock: Clock) -> int:
    global _reopened
    now = time.monotonic()
    if (_reopened is not None and _reopened[0] == generation()
            and now - _reopened[1] < conf.missing_step_retry().total_seconds()):
        return 0
    _reopened = (generation(), now)
    return reopen_runnable(clock=clock)


def reopen_runnable(*, clock: Clock = DATABASE) -> int:
    """Make pending again the runs stopped for staff because a deploy lacked steps of their plan, where this
    deploy has every step they still need; return how many."""
    ready = []
    stopped = (RunState.objects.filter(workflow__in=list(workflows())).stopped_lacking_steps()
               .only("run_id", "workflow", "plan_fingerprint").with_attempts())
    for run in stopped:
        plan = plan_of(run.workflow, run.plan_fingerprint)
        if plan is None:
            continue
        workflow = get_workflow(run.workflow)
        attempts = [a.to_attempt() for a in run.attempts.all()]
        # What it gave back when it stopped is needed again: this deploy must have those steps too.
        again = given_back(workflow.acquisitions(), attempts)
        remainder = compute_boundary(plan.names, attempts, given_back=again).remainder
        if not lacking(plan, workflow.policies(), remainder):
            ready.append(run.run_id)
    return reopen_runs(ready, reason="this deploy has the steps of the run's plan again", clock=clock)


def _claim(*, owner: str, lease_seconds: float, clock: Clock, run_id: str | None, first_steps: FirstSteps,
           before_first_intent: Callable[[str], None] | None, hints: bool = False,
           queues: tuple[str, ...] = (), skip: Collection[str] = ()) -> Claimed | None:
    """One claim, as `claim` describes it.

    On PostgreSQL, when it takes the oldest due run, a fresh run whose (workflow, plan fingerprint) is in
    `first_steps` also gets the intent of the named first step in the claim's commit (Claimed.first_intent), as
    each later step's intent rides on the result before it. `before_first_intent(step)` runs before that commit
    (fault injection). A claim of a named `run_id`, or on another database, records no intent.
    """
    if run_id is None and _fast():
        times = {"shift": clock.shift, "lease": timedelta(seconds=lease_seconds)}
        bounds = _limits_json()
        for _ in range(_PARKS_PER_CLAIM):
            try:
                taken = pgsql.claim(owner=owner, times=times, first_steps=_first_steps_json(first_steps),
                                    before_commit=before_first_intent, hints=hints, queues=queues, skip=skip,
                                    limits=bounds)
            except (DataError, IntegrityError):
                if not first_steps:
                    raise
                # The first intent rode on the claim and the database refused it: that run's data (a step name
                # longer than its column, recorded before a deploy that refuses such names). The statement took
                # nothing; claim again without it, so the engine records the intent on its own, where the pool
                # ends that run's turn only (worker.pool) instead of this claim stopping every pass at the same run.
                taken = pgsql.claim(owner=owner, times=times, first_steps=_first_steps_json(()),
                                    before_commit=before_first_intent, hints=hints, queues=queues, skip=skip,
                                    limits=bounds)
            # A run parked by its limit was not taken, and is out of every probe now: look again for the next.
            if taken is not None or pgsql.parked_by_last_claim() is None:
                break
        if taken is None:
            return None
        taken_id, epoch, workflow, fingerprint, payload, attempts, first_step, first_key, ending, trace = taken
        first = None if first_step is None else Intent(step=first_step, attempt=1, effect_key=str(first_key),
                                                      cursor=0)
        return Claimed(lease=Lease(run_id=taken_id, owner=owner, epoch=epoch, seconds=lease_seconds),
                       workflow=workflow, plan_fingerprint=fingerprint, input=_decoded(payload) or {},
                       attempts=[_attempt(a) for a in _decoded(attempts)], first_intent=first,
                       ending=ending or "", trace_context=_decoded(trace))
    with transaction.atomic(using=conf.database(), durable=True):
        # Concurrency limits here: the limited runs whose key has no slot free are left out. SQLite has one writer
        # at a time (its transactions begin IMMEDIATE, durableruns.sqlite), so the count and the take are not
        # raced; nothing is parked (the limited runs are walked past instead: SQLite is the small, embedded case).
        if run_id is None:
            candidates = RunState.objects.claimable(clock.expression(), queues=queues).within_limits(limits())
            if skip:
                candidates = candidates.exclude(pk__in=list(skip))
        else:
            candidates = RunState.objects.filter(pk=run_id).takeable(clock.expression())
            if not on_postgresql():  # PostgreSQL admits it under its key's lock, below
                candidates = candidates.within_limits(limits())
            candidates = candidates.select_for_update(skip_locked=True)
        row = candidates.values("run_id", "epoch", "workflow", "plan_fingerprint", "input", "ending",
                                "trace_context", "status", "concurrency_key").first()
        if row is None:
            return None
        if run_id is not None and on_postgresql() and not _admitted(row):
            return None
        # Conditional on the epoch read: on a database without row locks (SQLite) this is what keeps two
        # workers from both taking the run.
        moved = RunState.objects.filter(pk=row["run_id"], epoch=row["epoch"]).update(
            status=RunStatus.RUNNING,
            owner=owner,
            epoch=F("epoch") + 1,
            lease_expires_at=clock.expression(timedelta(seconds=lease_seconds)),
            wake_at=None,
            updated_at=clock.expression(),
        )
        if not moved:
            return None
    return Claimed(
        lease=Lease(run_id=row["run_id"], owner=owner, epoch=row["epoch"] + 1, seconds=lease_seconds),
        workflow=row["workflow"],
        plan_fingerprint=row["plan_fingerprint"],
        input=row["input"] or {},
        ending=row["ending"] or "",
        trace_context=row["trace_context"],
    )


def _admitted(row: dict[str, Any]) -> bool:
    """Whether a run named to a claim (resume_runs --run-id) may be taken under its concurrency limit: decided as
    every PostgreSQL claim decides it (durableruns_admit, under its (workflow, key)'s lock, counting with a
    snapshot taken after the lock), so two claims at once never both take the last slot. A running run keeps
    its slot; a run refused is left as it is, for a later claim."""
    bound = limits().get(row["workflow"])
    if bound is None or row["concurrency_key"] is None or row["status"] == RunStatus.RUNNING:
        return True
    return pgsql.admit(workflow=row["workflow"], key=row["concurrency_key"], limit=bound, run=row["run_id"])


def renew(lease: Lease, *, clock: Clock = DATABASE) -> None:
    """Extend the lease from the database's now, and record that the attempt in hand was alive then (the last
    moment its process could still have made its call); FencedOut if another worker took the run.

    On PostgreSQL a single statement in autocommit, never an open transaction: a worker paused between BEGIN and
    COMMIT would hold the run's row lock, and nobody could take the run over.
    """
    if _fast():
        renewed = pgsql.renew(run=lease.run_id, epoch=lease.epoch, times=_times(lease, clock))
    else:
        with transaction.atomic(using=conf.database(), durable=True):
            renewed = bool(RunState.objects.filter(pk=lease.run_id, epoch=lease.epoch, status=RunStatus.RUNNING)
                           .update(updated_at=clock.expression(), lease_expires_at=clock.expression(lease.duration)))
            if renewed:
                RunStep.objects.filter(run_id=lease.run_id, epoch=lease.epoch, status=StepStatus.STARTED).update(
                    renewed_at=clock.expression(), held_until=clock.expression(lease.duration))
    if not renewed:
        raise FencedOut("the run was released or taken over", run_id=lease.run_id, epoch=lease.epoch)


def renew_all(leases: list[Lease], *, clock: Clock = DATABASE) -> set[str]:
    """Renew many leases as `renew` does one, in one statement on PostgreSQL; return the run_ids renewed (any
    other was released or taken over)."""
    if not leases:
        return set()
    if _fast():
        return pgsql.renew_all(runs=[lease.run_id for lease in leases], epochs=[lease.epoch for lease in leases],
                               seconds=[lease.seconds for lease in leases], shift=clock.shift)
    renewed = set()
    for lease in leases:  # SQLite: one worker, a handful of leases
        try:
            renew(lease, clock=clock)
        except FencedOut:
            continue
        renewed.add(lease.run_id)
    return renewed


def record_intent(lease: Lease, intent: Intent, *, clock: Clock = DATABASE) -> None:
    """Commit 1: the step is about to act under its effect key, and the run is at this step."""
    level = _standby_level(intent)
    if _fast():
        if not pgsql.record_intent(run=lease.run_id, epoch=lease.epoch, owner=lease.owner, times=_times(lease, clock),
                                   cursor=intent.cursor, standby=level, **_intent_params(intent)):
            raise FencedOut(run_id=lease.run_id, epoch=lease.epoch)
        return
    with transaction.atomic(using=conf.database(), durable=True):
        _wait_for_standby(level)
        _fence(lease, clock, cursor=intent.cursor)
        _insert_intent(lease, intent, clock)


def record_result(
    lease: Lease,
    *,
    step: str,
    attempt: int,
    result: Any,
    cursor: int,
    clock: Clock = DATABASE,
    resolution: str = Resolution.RETURNED,
    intent_recorded: bool = True,
    effect_key: str = "",
    next_intent: Intent | None = None,
    finish: bool = False,
    encoded: str | None = None,
    children: list[NewChild] | None = None,
) -> None:
    """Commit 2: the step's result and the moved cursor, and in the same commit either the next step's intent
    or, with `finish`, the run's completion; and the child runs the step asked for (`children`), if any.

    Sharing the commit is safe: the next step has not acted yet, and its intent is still durable before it does.
    """
    encoded = to_json(result, what=f"the result of {step}") if encoded is None else encoded
    level = _standby_level(next_intent)
    if intent_recorded and not children and _fast():
        recorded = pgsql.record_result(
            run=lease.run_id, epoch=lease.epoch, owner=lease.owner, times=_times(lease, clock),
            cursor=next_intent.cursor if next_intent else cursor, step=step, attempt=attempt, result=encoded,
            resolution=resolution, finish=finish and next_intent is None,
            intent=_intent_params(next_intent) if next_intent else None, standby=level,
        )
        if not recorded:
            raise FencedOut(f"stale epoch, or attempt {attempt} of {step} is no longer started",
                            run_id=lease.run_id, epoch=lease.epoch)
        if isinstance(recorded, str):  # a child's end that saw a sibling still moving: ask once more, now
            _wake_parent_after(recorded, clock)
        if finish and next_intent is None:  # signals
            signals.run_finished(lease.run_id, RunStatus.COMPLETED)
        return
    with transaction.atomic(using=conf.database(), durable=True):
        _wait_for_standby(level)
        fields: dict[str, Any] = {"updated_at": clock.expression(),
                                  "lease_expires_at": clock.expression(lease.duration),
                                  "cursor": next_intent.cursor if next_intent else cursor}
        if finish and next_intent is None:
            fields.update(status=RunStatus.COMPLETED, lease_expires_at=None, wake_at=None, reason="")
        moved = RunState.objects.filter(pk=lease.run_id, epoch=lease.epoch).update(**fields)
        if not moved:
            raise FencedOut(run_id=lease.run_id, epoch=lease.epoch)
        if intent_recorded:
            _finish(lease, step, attempt, status=StepStatus.COMPLETED, result=result,
                    finished_at=clock.expression(), resolution=resolution)
        else:
            RunStep.objects.create(
                run_id=lease.run_id, step=step, attempt=attempt, status=StepStatus.COMPLETED,
                effect_key=effect_key, started_at=clock.expression(), finished_at=clock.expression(),
                result=result, resolution=resolution, owner=lease.owner, epoch=lease.epoch,
            )
        if next_intent is not None:
            _insert_intent(lease, next_intent, clock)
        elif finish:
            _wake_parent(lease.run_id, clock)
        if children:
            _record_children(lease, children, clock)
    for child in children or ():  # signals
        signals.send_on_commit(signals.run_started, RunState, run_id=child.run_id, workflow=child.workflow)
    if finish and next_intent is None:  # signals
        signals.run_finished(lease.run_id, RunStatus.COMPLETED)


def record_failure(lease: Lease, *, step: str, attempt: int, error: str, clock: Clock = DATABASE,
                   intent_recorded: bool = True, effect_key: str = "") -> None:
    """The far system rejected the call (observed): the attempt is failed, never rewritten."""
    error = storable(error)
    with transaction.atomic(using=conf.database(), durable=True):
        _fence(lease, clock)
        if intent_recorded:
            _finish(lease, step, attempt, status=StepStatus.FAILED, error=error, finished_at=clock.expression())
        else:
            RunStep.objects.create(
                run_id=lease.run_id, step=step, attempt=attempt, status=StepStatus.FAILED,
                effect_key=effect_key, started_at=clock.expression(), finished_at=clock.expression(), error=error,
                owner=lease.owner, epoch=lease.epoch,
            )
    signals.send_on_commit(signals.attempt_failed, RunStep, run_id=lease.run_id, step=step, attempt=attempt,
                           error=error)  # signals


def checkpoint(lease: Lease, *, step: str, attempt: int, loop_cursor: int, progress: dict[str, Any],
               clock: Clock = DATABASE) -> None:
    """Commit a loop's position and progress inside the started attempt (which was alive then, too)."""
    encoded = to_json(progress, what=f"the progress of {step}")
    if _fast():
        if not pgsql.checkpoint(run=lease.run_id, epoch=lease.epoch, times=_times(lease, clock), step=step,
                                attempt=attempt, loop=loop_cursor, progress=encoded):
            raise FencedOut(f"stale epoch, or attempt {attempt} of {step} is no longer started",
                            run_id=lease.run_id, epoch=lease.epoch)
        return
    with transaction.atomic(using=conf.database(), durable=True):
        _fence(lease, clock)
        moved = RunStep.objects.filter(
            run_id=lease.run_id, step=step, attempt=attempt, status=StepStatus.STARTED
        ).update(loop_cursor=loop_cursor, progress=progress, renewed_at=clock.expression(),
                 held_until=clock.expression(lease.duration))
        if not moved:
            raise FencedOut(f"attempt {attempt} of {step} is no longer started", run_id=lease.run_id,
                            epoch=lease.epoch)


def record_raised(lease: Lease, *, step: str, attempt: int, clock: Clock = DATABASE) -> datetime:
    """Record, on the database's clock, that the started attempt raised in its live worker and stays in doubt;
    return that moment. Its call was over by then, so every later pass bounds the call by it (policies.
    last_call_bound). FencedOut if another worker took the run."""
    with transaction.atomic(using=conf.database(), durable=True):
        _fence(lease, clock)
        now = clock.now()
        moved = RunStep.objects.filter(
            run_id=lease.run_id, step=step, attempt=attempt, status=StepStatus.STARTED
        ).update(raised_at=now)
        if not moved:
            raise FencedOut(f"attempt {attempt} of {step} is no longer started", run_id=lease.run_id,
                            epoch=lease.epoch)
    return now


def release(lease: Lease, *, status: str, clock: Clock = DATABASE, wake_at: datetime | None = None,
            reason: str = "") -> None:
    """Hand the run back: waiting until `wake_at` (a time of the database's clock), or stopped (completed,
    failed, cancelled, needs_decision)."""
    with transaction.atomic(using=conf.database(), durable=True):
        moved = RunState.objects.filter(pk=lease.run_id, epoch=lease.epoch).update(
            status=status, wake_at=wake_at, reason=storable(reason), lease_expires_at=None,
            updated_at=clock.expression()
        )
        if not moved:
            raise FencedOut(run_id=lease.run_id, epoch=lease.epoch)
        if status in (RunStatus.PENDING, RunStatus.WAITING):  # due now, or at a time idle workers must learn
            _wake_workers()
        elif status in ENDED:
            _wake_parent(lease.run_id, clock)
    signals.run_finished(lease.run_id, status, reason=storable(reason))  # signals: completed, failed, cancelled


def _ending_fields(run_id: str, final: str, *, release: str = "") -> dict[str, Any]:
    """How a staff act that ends a run unfinished sets its status: `final` at once when the run holds nothing
    a worker must give back, else pending with `ending` = `final` (a worker releases, then sets it). Staff act
    outside a worker: the releases are effects, and never run in a web request or inside this transaction.

    Abandoning the escalation of a release itself (`release` names a release step) gives up on that release
    only: the run stays ending, a worker goes on with the other releases and then ends it, and its holdings
    still list the abandoned hold (nobody pretends it is gone)."""
    current = RunState.objects.filter(pk=run_id).values_list("workflow", "ending").get()
    workflow_name, ending = current
    if ending and release.endswith(RELEASE_SUFFIX):
        return {"status": RunStatus.PENDING}
    try:
        workflow = get_workflow(workflow_name)
    except UnknownWorkflow:
        return {"status": final, "ending": ""}
    acquisitions = workflow.acquisitions()
    if not acquisitions:
        return {"status": final, "ending": ""}
    attempts = [row.to_attempt() for row in RunStep.objects.filter(run_id=run_id)]
    if needs_releasing(assess(workflow.plan, acquisitions, attempts)):
        return {"status": RunStatus.PENDING, "ending": final}
    return {"status": final, "ending": ""}


def begin_ending(lease: Lease, *, ending: str, reason: str, clock: Clock = DATABASE) -> None:
    """Record that the run, still in this worker's hands, ends unfinished as `ending` once it has given back
    what it holds: a crash from here on resumes the releasing, not the run."""
    with transaction.atomic(using=conf.database(), durable=True):
        _fence(lease, clock, ending=ending, reason=storable(reason))


def end(lease: Lease, *, clock: Clock = DATABASE, status: str | None = None, reason: str | None = None) -> str:
    """Its releases done, give the run the status it was ending with (the reason already says why), or `status`
    and `reason` where the engine knows better (a run stopped for a missing step whose deploy has it again)."""
    with transaction.atomic(using=conf.database(), durable=True):
        row = RunState.objects.select_for_update().filter(pk=lease.run_id, epoch=lease.epoch).values_list(
            "ending", "reason").first()
        if row is None:
            raise FencedOut(run_id=lease.run_id, epoch=lease.epoch)
        status = status or row[0] or RunStatus.CANCELLED
        reason = row[1] if reason is None else storable(reason)
        RunState.objects.filter(pk=lease.run_id, epoch=lease.epoch).update(
            status=status, ending="", wake_at=None, lease_expires_at=None, reason=reason,
            updated_at=clock.expression())
        if status == RunStatus.PENDING:
            _wake_workers()
        elif status in ENDED:
            _wake_parent(lease.run_id, clock)
    if status == RunStatus.FAILED:  # a cancellation was announced at the staff act that asked for it
        signals.run_finished(lease.run_id, status, reason=reason)
    return status


def open_escalation(lease: Lease, *, step: str, attempt: int, effect_key: str, in_doubt_since: datetime | None,
                    reason: str, clock: Clock = DATABASE) -> None:
    """Stop the run for a person: the escalation and the run's needs_decision status in one commit."""
    reason = storable(reason)
    with transaction.atomic(using=conf.database(), durable=True):
        moved = RunState.objects.filter(pk=lease.run_id, epoch=lease.epoch).update(
            status=RunStatus.NEEDS_DECISION, reason=reason, wake_at=None, lease_expires_at=None,
            updated_at=clock.expression()
        )
        if not moved:
            raise FencedOut(run_id=lease.run_id, epoch=lease.epoch)
        escalation, created = Escalation.objects.get_or_create(
            run_id=lease.run_id,
            step=step,
            attempt=attempt,
            defaults={"effect_key": effect_key, "in_doubt_since": in_doubt_since or clock.expression(),
                      "opened_at": clock.expression(), "reason": reason},
        )
    if created:  # signals
        signals.send_on_commit(signals.escalation_opened, Escalation, escalation_id=escalation.pk,
                               run_id=lease.run_id, step=step, attempt=attempt, reason=reason)


def record_decision(
    escalation_id: int,
    *,
    action: str,
    decided_by: str,
    user_id: int | None,
    note: str,
    result: Any,
    cursor: int | None,
    clock: Clock = DATABASE,
) -> Intervention:
    """Apply a staff decision once: the decision row, its effect on the attempt, and a resumable run, in one commit.

    The one-to-one between decision and escalation is what makes a second, concurrent decision fail.
    """
    try:
        with transaction.atomic(using=conf.database(), durable=True):
            now = clock.now()  # the database's, read once: the decision and what it changes carry one time
            escalation = Escalation.objects.select_for_update().get(pk=escalation_id)
            status = RunState.objects.filter(pk=escalation.run_id).values_list("status", flat=True).get()
            if status != RunStatus.NEEDS_DECISION and not Intervention.objects.filter(
                escalation_id=escalation_id
            ).exists():
                raise RunNotActionable(
                    f"the run is {status}, not waiting for a decision", run_id=escalation.run_id, status=status
                )
            decision = Intervention.objects.create(
                run_id=escalation.run_id, escalation=escalation, step=escalation.step,
                attempt=escalation.attempt, action=action, decided_by=decided_by, user_id=user_id,
                decided_at=now, note=note, result=result,
            )
            run_fields: dict[str, Any] = {"updated_at": now, "wake_at": None, "epoch": F("epoch") + 1}
            if action == Intervention.Action.HAPPENED:
                RunStep.objects.filter(
                    run_id=escalation.run_id, step=escalation.step, attempt=escalation.attempt,
                    status=StepStatus.STARTED,
                ).update(status=StepStatus.COMPLETED, result=result, finished_at=now,
                         resolution=Resolution.DECISION)
                run_fields.update(status=RunStatus.PENDING, cursor=cursor, reason=f"{decided_by}: it happened")
            elif action == Intervention.Action.DID_NOT_HAPPEN:
                run_fields.update(status=RunStatus.PENDING, reason=f"{decided_by}: it did not happen, run again")
            else:
                run_fields.update(reason=f"abandoned by {decided_by}: {note}",
                                  **_ending_fields(escalation.run_id, RunStatus.CANCELLED, release=escalation.step))
            RunState.objects.filter(pk=escalation.run_id).update(**run_fields)
            if run_fields["status"] == RunStatus.PENDING:
                _wake_workers()
            elif run_fields["status"] in ENDED:
                _wake_parent(escalation.run_id, clock)
            return decision
    except IntegrityError:
        first = Intervention.objects.select_related(None).get(escalation_id=escalation_id)
        raise AlreadyDecided(
            f"already decided by {first.decided_by} at {first.decided_at:%Y-%m-%d %H:%M:%S}: "
            f"{first.get_action_display()}",
            escalation_id=escalation_id,
            decided_by=first.decided_by,
            decided_at=first.decided_at,
        ) from None


def record_staff_action(
    run_id: str,
    *,
    action: str,
    allowed_from: tuple[str, ...],
    new_status: str,
    decided_by: str,
    user_id: int | None,
    note: str,
    step: str = "",
    attempt: int | None = None,
    clock: Clock = DATABASE,
) -> Intervention:
    """Cancel or retry a run: the staff act and the status change in one commit; the epoch bump fences its worker.

    A cancel also closes the run's open escalation, if any, so the queue does not keep asking about a run
    nobody will resume. Locks are taken escalation first, then run, the order record_decision uses.
    """
    cancelled: list[str] = []
    with transaction.atomic(using=conf.database(), durable=True):
        now = clock.now()
        pending = None
        if action == Intervention.Action.CANCEL:
            # Its unfinished descendants first, the deepest first: a child's row is locked before its parent's,
            # the order a child's own end takes them (_wake_parent, for the last child), so they never deadlock.
            for child in reversed(_descendants(run_id)):
                if _cancel_child(child, ancestor=run_id, decided_by=decided_by, user_id=user_id, note=note,
                                 now=now):
                    cancelled.append(child)
            pending = (Escalation.objects.select_for_update(of=("self",))
                       .filter(run_id=run_id, decision__isnull=True).first())
        run = RunState.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            raise RunNotFound(run_id=run_id)
        if run.status not in allowed_from:
            raise RunNotActionable(
                f"cannot {action} a run that is {run.status}", run_id=run_id, status=run.status
            )
        if action == Intervention.Action.CANCEL and run.ending == RunStatus.CANCELLED:
            # Already being cancelled (by a cancel or an abandon): a worker is giving back what it holds. A
            # second act would be a second record of the same decision.
            raise RunNotActionable(
                f"the run is already being cancelled ({run.reason}): a worker is giving back what it holds",
                run_id=run_id, status=run.status,
            )
        status_fields: dict[str, Any] = {"status": new_status}
        if action == Intervention.Action.CANCEL:
            status_fields = _ending_fields(run_id, new_status)
            new_status = status_fields["status"]
        RunState.objects.filter(pk=run_id).update(
            epoch=F("epoch") + 1, wake_at=None, lease_expires_at=None, updated_at=now,
            reason=f"{action} by {decided_by}: {note}", **status_fields,
        )
        if new_status == RunStatus.PENDING:
            _wake_workers()
        elif new_status in ENDED and run_id not in cancelled:
            _wake_parent(run_id, clock)
        fields: dict[str, Any] = {"run_id": run_id, "step": step, "attempt": attempt, "action": action,
                                  "decided_by": decided_by, "user_id": user_id, "decided_at": now, "note": note}
        act = _staff_act(fields, pending)
    for child in cancelled:  # signals
        signals.run_finished(child, RunStatus.CANCELLED, reason=f"cancel by {decided_by} with {run_id}: {note}",
                             by=decided_by)
    return act


def _staff_act(fields: dict[str, Any], pending: Escalation | None) -> Intervention:
    """Record a staff act on a run, closing its open escalation `pending` with it if a decision has not."""
    if pending is not None:
        try:
            with transaction.atomic(using=conf.database()):  # a decision may have won the escalation meanwhile
                return Intervention.objects.create(escalation=pending, **dict(
                    fields, step=pending.step, attempt=pending.attempt))
        except IntegrityError:
            pass
    return Intervention.objects.create(**fields)


def _descendants(run_id: str) -> list[str]:
    """The run's children, then their children, and so on: breadth first, by the parent index."""
    found: list[str] = []
    frontier = [run_id]
    while frontier:
        frontier = list(RunState.objects.filter(parent_id__in=frontier).order_by("run_id")
                        .values_list("run_id", flat=True))
        found.extend(frontier)
    return found


def _cancel_child(run_id: str, *, ancestor: str, decided_by: str, user_id: int | None, note: str,
                  now: datetime) -> bool:
    """Inside the cancel of `ancestor`: cancel its descendant `run_id` if it is unfinished, as a staff cancel of
    it would (its open escalation closed, what it holds given back by a worker first, its worker fenced out by
    the epoch bump); False if it had ended."""
    pending = (Escalation.objects.select_for_update(of=("self",))
               .filter(run_id=run_id, decision__isnull=True).first())
    if RunState.objects.select_for_update().filter(pk=run_id).unfinished().values_list("pk", flat=True).first() is None:
        return False
    fields = _ending_fields(run_id, RunStatus.CANCELLED)
    reason = f"cancel by {decided_by} with {ancestor}: {note}"
    RunState.objects.filter(pk=run_id).update(epoch=F("epoch") + 1, wake_at=None, lease_expires_at=None,
                                              updated_at=now, reason=storable(reason), **fields)
    if fields["status"] == RunStatus.PENDING:
        _wake_workers()  # a worker gives back what it holds, then ends it cancelled
    _staff_act({"run_id": run_id, "step": "", "attempt": None, "action": Intervention.Action.CANCEL,
                "decided_by": decided_by, "user_id": user_id, "decided_at": now, "note": reason}, pending)
    return True


def adopt_plan(
    run_id: str,
    *,
    plan: Plan,
    allowed_from: tuple[str, ...],
    decided_by: str,
    user_id: int | None,
    note: str,
    clock: Clock = DATABASE,
) -> Intervention:
    """Move a run to `plan` on purpose: the fit check, the new fingerprint and the staff act in one commit.

    The fit is checked on the record as it is under the run's row lock, of a run no worker holds (its status in
    `allowed_from`, or running under a lease that ran out), so no attempt can be added between the check and the
    move. The epoch bump fences whoever
    held it before; the run is pending, and the next pass follows `plan`.
    """
    with transaction.atomic(using=conf.database(), durable=True):
        now = clock.now()
        run = RunState.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            raise RunNotFound(run_id=run_id)
        # A run whose worker died (running, its lease run out) is held by nobody, as a waiting one is.
        abandoned = run.status == RunStatus.RUNNING and (run.lease_expires_at is None or run.lease_expires_at < now)
        if run.status not in allowed_from and not abandoned:
            raise RunNotActionable(f"cannot adopt_plan for a run that is {run.status} (held by {run.owner})"
                                   if run.status == RunStatus.RUNNING else
                                   f"cannot adopt_plan for a run that is {run.status}", run_id=run_id,
                                   status=run.status)
        if run.plan_fingerprint == plan.fingerprint:
            raise RunNotActionable(f"the run follows plan {plan.fingerprint} already", run_id=run_id,
                                   status=run.status)
        old = plan_of(run.workflow, run.plan_fingerprint)
        attempts = [row.to_attempt() for row in RunStep.objects.of_run(run_id)]
        check_fit(run_id, attempted=attempted_in_order(old, [(a.step, a.started_at) for a in attempts]),
                  policies=dict(old.steps) if old else None, new=plan.steps, new_fingerprint=plan.fingerprint)
        record_plan(plan, clock=clock)
        remainder = compute_boundary(plan.names, attempts).remainder
        RunState.objects.filter(pk=run_id).update(
            plan_fingerprint=plan.fingerprint, status=RunStatus.PENDING, epoch=F("epoch") + 1, wake_at=None,
            lease_expires_at=None, updated_at=now,
            cursor=plan.names.index(remainder[0]) if remainder else len(plan.names),
            reason=storable(f"adopt_plan by {decided_by}: {note} (plan {run.plan_fingerprint} -> {plan.fingerprint})"),
        )
        _wake_workers()
        return Intervention.objects.create(
            run_id=run_id, action=Intervention.Action.ADOPT_PLAN, decided_by=decided_by, user_id=user_id,
            decided_at=now, note=note,
            result={"from_plan": run.plan_fingerprint, "to_plan": plan.fingerprint,
                    "from_steps": [list(s) for s in old.steps] if old else None,
                    "to_steps": [list(s) for s in plan.steps]},
        )


def reopen_runs(run_ids: list[str], *, reason: str, clock: Clock = DATABASE) -> int:
    """Make runs stopped for lacking steps workable again (pending), those still stopped for that reason only;
    the epoch bump fences nobody (no worker holds a stopped run) but keeps every change of hands counted."""
    if not run_ids:
        return 0
    with transaction.atomic(using=conf.database(), durable=True):
        moved = RunState.objects.filter(pk__in=run_ids).stopped_lacking_steps().update(
            status=RunStatus.PENDING, epoch=F("epoch") + 1, wake_at=None, reason=storable(reason),
            updated_at=clock.expression())
        if moved:
            _wake_workers()
        return moved


# -- retention and alerts (durableruns.ops): the other writes, kept here with the rest ---------------------

# Children first: interventions point at escalations, everything points at the run.
_RUN_TABLES = (
    ("interventions", Intervention._meta.db_table),
    ("escalations", Escalation._meta.db_table),
    ("attempts", RunStep._meta.db_table),
    ("runs", RunState._meta.db_table),
)


def delete_runs(ids: list[str]) -> dict[str, int]:
    """Delete the runs `ids` (locked by the caller's transaction) and what hangs on them, by primary key list:
    plain DELETEs, not Django's collector, which would first read every row (inputs and results included).
    Return how many rows went from each: interventions, escalations, attempts, runs."""
    placeholders = ", ".join(["%s"] * len(ids))
    deleted = {}
    with connections[conf.database()].cursor() as cursor:
        for counter, table in _RUN_TABLES:
            # The table names are the models' own (above), never input; the ids go as parameters.
            cursor.execute(f"DELETE FROM {table} WHERE run_id IN ({placeholders})", ids)
            deleted[counter] = cursor.rowcount
    return deleted


def take_alert_mark(escalation_id: int, *, previous: datetime | None, now: datetime) -> bool:
    """Mark an open escalation alerted at `now`, only if its mark is still `previous` (what the pass read): of
    two overlapping passes, one takes it and sends."""
    return bool(Escalation.objects.filter(pk=escalation_id, alerted_at=previous, decision__isnull=True)
                .update(alerted_at=now))


def give_alert_mark_back(escalation_id: int, *, now: datetime, previous: datetime | None) -> None:
    """The alert was not sent: put the mark back, so the next pass tries again."""
    Escalation.objects.filter(pk=escalation_id, alerted_at=now).update(alerted_at=previous)


def take_run_alert_mark(run_id: str, *, previous: datetime | None, now: datetime) -> bool:
    """Mark a run stopped for staff alerted at `now`, only if it still is stopped and its mark is still
    `previous` (what the pass read): of two overlapping passes, one takes it and sends."""
    return bool(RunState.objects.filter(pk=run_id, status=RunStatus.NEEDS_DECISION, alerted_at=previous)
                .update(alerted_at=now))


def give_run_alert_mark_back(run_id: str, *, now: datetime, previous: datetime | None) -> None:
    """The alert was not sent: put the mark back, so the next pass tries again."""
    RunState.objects.filter(pk=run_id, alerted_at=now).update(alerted_at=previous)


# -- runs that wait (durableruns.waits): a wait is a started attempt, a status and a wake time ------------------


def _came(run_id: str, *, event: str, approval: bool, step: str, attempt: int, join: bool = False) -> bool:
    """Whether what the wait at `step` (attempt `attempt`) waits for is in the record already: an event of its
    name not consumed (`event`), a decision on the approval's attempt (`approval`), or, for a join, the end of
    every child run."""
    if join:
        return not RunState.objects.filter(parent_id=run_id).unfinished().exists()
    if event:
        return RunEvent.objects.filter(run_id=run_id, event=event, consumed_at__isnull=True).exists()
    return approval and Intervention.objects.filter(run_id=run_id, step=step, attempt=attempt,
                                       action__in=APPROVAL_ACTIONS).exists()


APPROVAL_ACTIONS = (Intervention.Action.APPROVE, Intervention.Action.REJECT)


def wait(lease: Lease, *, step: str, attempt: int, until: datetime | None, reason: str, event: str = "",
         approval: bool = False, join: bool = False, cursor: int | None = None, effect_key: str = "",
         detail: dict[str, Any] | None = None, clock: Clock = DATABASE) -> None:
    """Hand the run back waiting at the wait `step` until `until` (None: until something is sent or decided),
    holding no lease; with `detail`, first begin the wait: its started attempt records what it waits for and
    until when, once. One commit.

    The run's row is updated first (on PostgreSQL its lock; on SQLite the write lock), then the record is read
    again: an event or decision that committed before is seen, and the run is due at once; one committing after
    finds the run waiting and makes it due itself (record_event, record_approval, a child's end: _wake_parent).
    Nothing sent is left waiting out the timeout."""
    fields: dict[str, Any] = {"status": RunStatus.WAITING, "wake_at": until, "lease_expires_at": None,
                              "reason": storable(reason), "updated_at": clock.expression()}
    if cursor is not None:
        fields["cursor"] = cursor
    with transaction.atomic(using=conf.database(), durable=True):
        if not RunState.objects.filter(pk=lease.run_id, epoch=lease.epoch).update(**fields):
            raise FencedOut(run_id=lease.run_id, epoch=lease.epoch)
        if detail is not None:
            RunStep.objects.create(
                run_id=lease.run_id, step=step, attempt=attempt, status=StepStatus.STARTED, effect_key=effect_key,
                started_at=clock.expression(), owner=lease.owner, epoch=lease.epoch, progress=detail)
        if _came(lease.run_id, event=event, approval=approval, step=step, attempt=attempt, join=join):
            RunState.objects.filter(pk=lease.run_id).update(wake_at=clock.expression())
        _wake_workers()  # idle workers learn the wake time (their timer), or take it now


def complete_wait(lease: Lease, *, step: str, attempt: int, begun: bool, effect_key: str, result: Any,
                  resolution: str, cursor: int, event_id: int | None = None, clock: Clock = DATABASE) -> None:
    """Complete the wait `step` with `result` (inserting its attempt if it never began), and consume the event
    `event_id` for it: one commit, so an event is consumed exactly when a wait completes with it."""
    encoded = to_json(result, what=f"the result of {step}")
    if _fast():
        if not pgsql.complete_wait(run=lease.run_id, epoch=lease.epoch, owner=lease.owner, times=_times(lease, clock),
                                   cursor=cursor, step=step, attempt=attempt, begun=begun, key=effect_key,
                                   result=encoded, resolution=resolution, event_id=event_id):
            raise FencedOut(f"stale epoch, attempt {attempt} of {step} not as it was, or event {event_id} consumed "
                            f"already", run_id=lease.run_id, epoch=lease.epoch)
        return
    with transaction.atomic(using=conf.database(), durable=True):
        _fence(lease, clock, cursor=cursor)
        if begun:
            _finish(lease, step, attempt, status=StepStatus.COMPLETED, result=json.loads(encoded),
                    finished_at=clock.expression(), resolution=resolution)
        else:
            RunStep.objects.create(
                run_id=lease.run_id, step=step, attempt=attempt, status=StepStatus.COMPLETED, effect_key=effect_key,
                started_at=clock.expression(), finished_at=clock.expression(), result=json.loads(encoded),
                resolution=resolution, owner=lease.owner, epoch=lease.epoch)
        if event_id is not None and not RunEvent.objects.filter(pk=event_id, run_id=lease.run_id,
                                                                consumed_at__isnull=True).update(
                consumed_step=step, consumed_attempt=attempt, consumed_at=clock.expression()):
            raise FencedOut(f"event {event_id} was consumed already", run_id=lease.run_id, epoch=lease.epoch)


def now_and_oldest_event(run_id: str, event: str, clock: Clock = DATABASE
                         ) -> tuple[datetime, tuple[int, dict[str, Any]] | None]:
    """The database's now and the oldest event of that name sent to the run and not consumed, as (id, payload) or
    None: one round trip on PostgreSQL."""
    if on_postgresql():
        now, row = pgsql.now_and_oldest_event(run=run_id, event=event, shift=clock.shift)
        return as_django(now), None if row is None else (row[0], _decoded(row[1]) or {})
    row = (RunEvent.objects.filter(run_id=run_id, event=event, consumed_at__isnull=True)
           .order_by("sent_at", "id").values_list("id", "payload").first())
    return clock.now(), None if row is None else (row[0], row[1] or {})


ENDED = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


def record_event(run_id: str, *, event: str, payload: dict[str, Any], key: str | None,
                 clock: Clock = DATABASE) -> bool:
    """Record an event for a run; False if the run has an event with `key` already (nothing changes). A run
    waiting for an event of that name is due at once, and idle workers are woken when this commits.

    Inside the caller's transaction it joins it (a duplicate key does not break it: on PostgreSQL the insert is
    ON CONFLICT DO NOTHING, elsewhere behind a savepoint): the event exists exactly when the caller's records do,
    and wakes nobody if they roll back."""
    encoded = to_json(payload, what="the payload")
    alias = conf.database()
    with transaction.atomic(using=alias, durable=not connections[alias].in_atomic_block):
        status = (RunState.objects.select_for_update().filter(pk=run_id)
                  .values_list("status", flat=True).first())
        if status is None:
            raise RunNotFound(run_id=run_id)
        if status in ENDED:
            raise RunNotActionable(f"the run is {status}: it waits for nothing", run_id=run_id, status=status)
        if on_postgresql():  # one statement: ON CONFLICT keeps the caller's transaction whole, no savepoint
            return pgsql.record_event(run=run_id, event=event, key=key, payload=encoded, shift=clock.shift)
        if key is not None and RunEvent.objects.filter(run_id=run_id, key=key).exists():
            return False
        try:
            with transaction.atomic(using=conf.database()):
                RunEvent.objects.create(run_id=run_id, event=event, key=key, payload=payload,
                                        sent_at=clock.expression())
        except IntegrityError:
            if key is not None:  # a concurrent sender with the same key committed first
                return False
            raise
        if status == RunStatus.WAITING and RunStep.objects.filter(
                run_id=run_id, status=StepStatus.STARTED, progress__event=event).exists():
            RunState.objects.filter(pk=run_id, status=RunStatus.WAITING).update(wake_at=clock.expression())
            _wake_workers()
    return True


def record_approval(run_id: str, *, step: str, approved: bool, decided_by: str, user_id: int | None, note: str,
                    clock: Clock = DATABASE) -> Intervention:
    """Decide the approval `step` the run waits at, once: the decision is its own row (who, when, why), and the
    run is due at once. A second decision raises AlreadyDecided (the unique index settles a race)."""
    with transaction.atomic(using=conf.database(), durable=True):
        now = clock.now()
        run = RunState.objects.select_for_update().filter(pk=run_id).values_list("status", flat=True).first()
        if run is None:
            raise RunNotFound(run_id=run_id)
        latest = RunStep.objects.filter(run_id=run_id, step=step).order_by("-attempt").values_list(
            "attempt", "status").first()
        first = Intervention.objects.filter(run_id=run_id, step=step, action__in=APPROVAL_ACTIONS).order_by(
            "-attempt").first()
        if first is not None and latest is not None and first.attempt == latest[0]:
            raise _already(first)
        if latest is None or latest[1] != StepStatus.STARTED:
            raise ApprovalNotFound(f"run {run_id} does not wait for the approval {step}", run_id=run_id, step=step)
        if run not in (RunStatus.WAITING, RunStatus.NEEDS_DECISION, RunStatus.RUNNING, RunStatus.PENDING):
            raise RunNotActionable(f"the run is {run}: its approval cannot be decided", run_id=run_id, status=run)
        try:
            with transaction.atomic(using=conf.database()):
                decision = Intervention.objects.create(
                    run_id=run_id, step=step, attempt=latest[0], decided_by=decided_by, user_id=user_id,
                    decided_at=now, note=note,
                    action=Intervention.Action.APPROVE if approved else Intervention.Action.REJECT)
        except IntegrityError:
            raise _already(Intervention.objects.get(run_id=run_id, step=step, attempt=latest[0],
                                                    action__in=APPROVAL_ACTIONS)) from None
        RunState.objects.filter(pk=run_id, status=RunStatus.WAITING).update(wake_at=now)
        RunState.objects.filter(pk=run_id, status=RunStatus.NEEDS_DECISION).update(
            status=RunStatus.PENDING, wake_at=None, updated_at=now,
            reason=storable(f"{decided_by} {'approved' if approved else 'rejected'} {step}: {note}"))
        _wake_workers()
    return decision


def _already(first: Intervention) -> AlreadyDecided:
    return AlreadyDecided(
        f"already decided by {first.decided_by} at {first.decided_at:%Y-%m-%d %H:%M:%S}: {first.get_action_display()}",
        run_id=first.run_id, step=first.step, decided_by=first.decided_by, decided_at=first.decided_at)


# -- child runs (durableruns.children): a run started by a step of another, and the wake of its parent's join -----

UNFINISHED = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.NEEDS_DECISION)


@dataclass(frozen=True, kw_only=True)
class NewChild:
    """A child run a step asked for (durableruns.children): what its row records."""

    run_id: str
    workflow: str
    plan: Plan
    input: dict[str, Any]
    concurrency_key: str | None = None  # its workflow's limit key, asked of its input once, as start() asks it


def child_exists(child: NewChild, *, parent: str) -> bool:
    """Whether the child is in the record already (True), after comparing it with the one asked for: another
    workflow, input or parent under its run_id is InvalidInput. False: it is not recorded yet."""
    if not RunState.objects.filter(pk=child.run_id).exists():
        return False
    _same_child(child.run_id, parent=parent, workflow=child.workflow, input=child.input)
    return True


def _record_children(lease: Lease, children: list[NewChild], clock: Clock) -> None:
    """Inside a step's result commit: insert the children it asked for, pending, their parent on them. A row
    that is there already (ON CONFLICT DO NOTHING) was compared when the step asked for it."""
    for plan in {c.plan.fingerprint: c.plan for c in children}.values():
        record_plan(plan, clock=clock)
    RunState.objects.bulk_create(
        [RunState(run_id=c.run_id, workflow=c.workflow, plan_fingerprint=c.plan.fingerprint, input=c.input,
                  status=RunStatus.PENDING, parent_id=lease.run_id, concurrency_key=c.concurrency_key,
                  created_at=clock.expression(), updated_at=clock.expression()) for c in children],
        ignore_conflicts=True)
    _wake_workers()


def start_child(lease: Lease, *, run_id: str, workflow: str, plan: Plan, input: dict[str, Any],
                concurrency_key: str | None = None, clock: Clock = DATABASE) -> bool:
    """Record the pending child run `run_id` of the run `lease` holds, its parent recorded on it, in one commit
    fenced on the parent's epoch (a worker fenced out, the parent cancelled or taken over, starts nothing);
    return True if created, False if that child exists already with the same workflow and input (a step run
    again after a crash). Insert or compare: the primary key refuses a second child of that run_id, however
    concurrent; the same run_id with another workflow, input or parent is InvalidInput."""
    with transaction.atomic(using=conf.database(), durable=True):
        _fence(lease, clock)
        created = False
        if not RunState.objects.filter(pk=run_id).exists():
            record_plan(plan, clock=clock)
            try:
                with transaction.atomic(using=conf.database()):
                    RunState.objects.create(
                        run_id=run_id, workflow=workflow, plan_fingerprint=plan.fingerprint, input=input,
                        status=RunStatus.PENDING, parent_id=lease.run_id, concurrency_key=concurrency_key,
                        created_at=clock.expression(), updated_at=clock.expression())
                created = True
            except IntegrityError:  # a stale worker of the same parent made it first: compare with it
                pass
        if created:
            _wake_workers()
        else:
            _same_child(run_id, parent=lease.run_id, workflow=workflow, input=input)
    if created:
        signals.send_on_commit(signals.run_started, RunState, run_id=run_id, workflow=workflow)  # signals
    return created


def _same_child(run_id: str, *, parent: str, workflow: str, input: dict[str, Any]) -> None:
    row = RunState.objects.filter(pk=run_id).values_list("parent_id", "workflow", "input").get()
    if row[0] != parent:
        raise InvalidInput(f"run {run_id} exists already and is not a child of {parent}: choose another key",
                           run_id=run_id)
    if row[1] != workflow or _decoded(row[2]) != json.loads(to_json(input, what="the input")):
        raise InvalidInput(f"child run {run_id} was started with another workflow or input ({row[1]}): a key "
                           f"names one child; give another child another key", run_id=run_id)


def _wake_parent(run_id: str, clock: Clock) -> None:
    """Inside the commit that ends the child run `run_id`: make its parent due at once if it waits (at its join)
    and no other child of it may still move, as this transaction sees them; idle workers are woken on commit.

    Children of one parent end without locking the parent's row (their ends would queue on it, one commit
    after another). Two last children ending together may each see the other still running, and neither wake
    the parent here: so a child that saw a sibling unfinished asks once more, in one statement after its own
    commit (_wake_parent_after). The last child to commit asks after every other child's end committed, and its
    statement sees them all ended. Were it killed between its commit and that statement, the join's recheck
    (waits.JOIN_RECHECK) finds its children ended from the record alone."""
    parent = RunState.objects.filter(pk=run_id).values_list("parent_id", flat=True).first()
    if parent is None:
        return
    if RunState.objects.filter(parent_id=parent).exclude(pk=run_id).unfinished().exists():
        transaction.on_commit(functools.partial(_wake_parent_after, parent, clock), robust=True)
        return
    if RunState.objects.filter(pk=parent, status=RunStatus.WAITING).update(wake_at=clock.expression()):
        _wake_workers()


def _wake_parent_after(parent: str, clock: Clock) -> None:
    """After a child's end committed: one statement that makes the parent due if it waits and none of its
    children may still move. Its snapshot is taken after that commit; if the parent's own wait holds its row,
    the update waits for it and then finds it waiting."""
    woke = RunState.objects.filter(pk=parent, status=RunStatus.WAITING).exclude(
        Exists(RunState.objects.filter(parent_id=OuterRef("pk"), status__in=UNFINISHED))
    ).update(wake_at=clock.expression())
    if woke:
        _wake_workers()
