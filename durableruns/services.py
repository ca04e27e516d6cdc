"""Use cases for the edges (commands, admin, API): each is one call that parses nothing and renders nothing."""

from __future__ import annotations

import os
import socket
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from durableruns import bulks, conf, deadlines, reading, schedules, signals, store
from durableruns.boundary import Boundary
from durableruns.clock import Clock, on_postgresql
from durableruns.debounce import debounce_of
from durableruns.engine import tracing_in_use
from durableruns.errors import (
    ApprovalNotFound,
    EscalationNotFound,
    InvalidDecision,
    InvalidInput,
    ResultNotJSON,
    RunNotActionable,
    UnknownWorkflow,
)
from durableruns.models import Escalation, Intervention, RunPlan, RunState, RunStatus, RunStep
from durableruns.passes import RunOutcome
from durableruns.plans import lacking
from durableruns.policies import Action, Outcome, settle_in_doubt
from durableruns.registry import Workflow, get_workflow, startable, workflows
from durableruns.waits import Kind
from durableruns.worker.bulks import BulkWorker
from durableruns.worker.heartbeat import Heartbeat
from durableruns.worker.listener import Listener, seconds_until_next_due
from durableruns.worker.pool import Budget, PassReport, Stopping, Waker, WorkerPool
from durableruns.worker.presence import Presence
from durableruns.worker.timetable import Timetable
from durableruns.worker.watchdog import Watchdog

# What the edges read about a run (durableruns.reading): they read it through services, as they always have.
boundary_of = reading.boundary_of
get_run = reading.get_run
holdings_of = reading.holdings_of
lacking_of = reading.lacking_of
outlived_timeout = reading.outlived_timeout
plan_of = reading.plan_of
run_boundary = reading.run_boundary
attributes_of = reading.attributes_of
with_attributes = reading.with_attributes
attribute_value_run_ids = reading.attribute_value_run_ids
run_holdings = reading.run_holdings
run_plan = reading.run_plan
step_doc = reading.step_doc
step_policy = reading.step_policy
with_hold_lapses = reading.with_hold_lapses


def non_atomic_requests(view: Any) -> Any:
    """Opt a view that calls these services out of ATOMIC_REQUESTS on every database (the runs' among them):
    the services commit each fact in its own durable transaction, which cannot nest in the request's."""
    for alias in settings.DATABASES:
        view = transaction.non_atomic_requests(using=alias)(view)
    return view


def default_owner() -> str:
    """Name this worker process: host and pid, so an operator can find it."""
    return f"{socket.gethostname()}:{os.getpid()}"


def start_run(workflow_name: str, input: Any, *, run_id: str | None = None, priority: int = 0,
              queue: str = "default", run_after: datetime | None = None, internal: Workflow | None = None,
              debounce: timedelta | None = None, key: str | None = None,
              deadline: timedelta | datetime | None = None) -> str:
    """Record a pending run of a registered workflow and return its run_id; a worker executes it.

    Among due runs a worker takes the highest `priority` first; a worker limited to queues (resume_runs --queue)
    takes only runs on its `queue`s; a run with `run_after` (an aware datetime) is not due before that time, by
    the database's clock. In a process that traces (the [otel] extra), the trace context current now is
    recorded with it: the run's passes continue it. A workflow with a concurrency_key has it asked of `input`
    now, once; the run records it and counts under it. `deadline` (a positive timedelta from the start on the
    database's clock, or an aware datetime; default the workflow's own) is when the run must have ended
    (durableruns.deadlines).

    An internal workflow (Workflow(..., internal=True)) is refused as an unknown name is (UnknownWorkflow), unless
    `internal` is that Workflow itself: only the code that declares it starts it (the Tasks backend's enqueue).

    With `debounce` (a positive timedelta) and `key`: while the run started with this key has not begun, this start
    replaces its input, moves its start to now + debounce by the database's clock, and returns its run id; once it
    has begun, a new run is started (durableruns.store.debounce).
    """
    workflow = startable(workflow_name, internal=internal)
    if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise InvalidInput(f"priority must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}, not {priority!r}")
    if not isinstance(queue, str) or not queue.strip() or len(queue) > 100 or not _storable_text(queue):
        raise InvalidInput(f"queue must be a non-empty name of at most 100 characters, not {queue!r}")
    if run_after is not None and (not isinstance(run_after, datetime) or run_after.tzinfo is None):
        raise InvalidInput(f"run_after must be an aware datetime, not {run_after!r}")
    deadline, on_deadline = deadlines.at_start(workflow, deadline)
    if not isinstance(input, dict):
        raise InvalidInput(f"the input must be a JSON object, not {type(input).__name__}")
    try:
        store.ensure_json(input, what="the input")
    except ResultNotJSON as exc:
        raise InvalidInput(str(exc)) from None
    if run_id is not None and (not isinstance(run_id, str) or not run_id.strip() or len(run_id) > 200):
        raise InvalidInput("run_id must be a non-empty string of at most 200 characters")
    if run_id is not None and not _storable_text(run_id):
        # PostgreSQL refuses a NUL in text (SQLite stores it), neither encodes a lone surrogate: say so here,
        # the same on both, before anything is written.
        # The message spells the id with escapes (repr); a raw surrogate would break whoever renders it.
        raise InvalidInput(f"run_id {run_id!r} holds a NUL character or a lone surrogate, which cannot be stored")
    if run_id is not None and _has_control_character(run_id):
        # A run id goes into mail headers, log lines and terminals: a newline in it breaks an alert's subject
        # for ever, an escape sequence rewrites an operator's screen.
        raise InvalidInput(f"run_id {run_id!r} holds a control character (a newline, a tab, ...), which is refused")
    concurrency_key = workflow.limit_key(input)  # asked once, here, and recorded: a resume never asks again
    if concurrency_key is not None and (len(concurrency_key) > 200 or not _storable_text(concurrency_key)):
        raise InvalidInput(f"the concurrency key of {workflow_name} must be at most 200 storable characters, not "
                           f"{concurrency_key[:60]!r}")
    debouncing = debounce_of(debounce, key, run_after=run_after)
    attributes = workflow.attributes_of(input)  # asked once, here, and recorded with the run in its commit
    run_id = run_id or f"{workflow_name}-{uuid.uuid4().hex[:12]}"
    plan = workflow.as_plan()
    traces = tracing_in_use()
    trace_context = None if traces is None else traces.current_context()
    if debouncing is not None:
        return store.debounce_run(run_id=run_id, workflow=workflow.name, plan_fingerprint=plan.fingerprint,
                                  input=input, key=debouncing[1], debounce=debouncing[0], plan=plan,
                                  trace_context=trace_context, priority=priority, queue=queue,
                                  concurrency_key=concurrency_key, attributes=attributes, deadline=deadline,
                                  on_deadline=on_deadline)[0]
    store.create_run(run_id=run_id, workflow=workflow.name, plan_fingerprint=plan.fingerprint, input=input, plan=plan,
                     trace_context=trace_context, priority=priority, queue=queue, run_after=run_after,
                     concurrency_key=concurrency_key, deadline=deadline, on_deadline=on_deadline,
                     attributes=attributes)
    return run_id


def _has_control_character(text: str) -> bool:
    """Whether `text` holds a control character (C0, DEL, C1) or a line or paragraph separator."""
    return any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in text)


# What the priority column holds (a PostgreSQL integer).
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1


def _storable_text(text: str) -> bool:
    """Whether every database durableruns runs on can store `text`: no NUL, and valid UTF-8 (no lone surrogate)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def wait_for_result(run_id: str, *, timeout: float | None = None) -> dict[str, Any]:
    """Wait until the run ends; return its results by step, or raise RunFailed / RunCancelled / TimeoutError."""
    from durableruns.results import wait_for_result as wait

    return wait(run_id, timeout=timeout)


# -- resuming -------------------------------------------------------------------------------------------


def resume_due(
    *,
    limit: int | None = None,
    owner: str | None = None,
    lease_seconds: float | None = None,
    run_id: str | None = None,
    max_seconds: float | None = None,
    clock: Clock | None = None,
    on_outcome: Callable[[RunOutcome], None] | None = None,
    concurrency: int = 1,
    stopping: Stopping | None = None,
    waker: Waker | None = None,
    idle_seconds: float = 5.0,
    grace: float | None = None,
    listen: bool = False,
    on_start: Callable[[str], None] | None = None,
    report_presence: bool = False,
    on_claim: Callable[[float], None] | None = None,
    queues: Iterable[str] = (),
) -> PassReport:
    """Claim due runs and work them, with `concurrency` threads, until none is due (or, given a `waker`, until
    `stopping` is set or `max_seconds` pass); safe to run from any number of hosts at once, whatever their
    clocks say: every time that decides ownership is the database's (`clock` shifts it, for tests).

    One run's trouble ends that run's turn only: a bug inside durableruns, or data the database refuses, is
    recorded as the run's reason and the run waits out a backoff, while the others go on. A database that cannot
    be reached stops the pass (raised to the caller): nothing is half recorded, since every fact is its own
    transaction, and the next pass picks up from the record.

    With a `waker` and `listen` on PostgreSQL (and DURABLERUNS_LISTEN, on by default), idle threads are woken by
    notifications (a new run, a decision) and by a timer for the next wake time or lease expiry, polling every
    `idle_seconds` as the safety net;
    `on_start` is told how the process picks work up. With `report_presence` (a resume_runs process) it reports
    itself in run_worker while it works, for health checks.

    `on_claim(seconds)`, if given, hears how long each claim took (a worker's metrics); without it nothing is
    timed. With `queues`, only runs on those queues are claimed (default: every queue).
    """
    clock = clock or store.DATABASE
    report = PassReport()
    began = time.monotonic()
    listening = listen and conf.listen() and on_postgresql()
    listener = Listener(waker).start() if waker is not None and listening else None
    if on_start is not None:
        pickup = f"polling every {idle_seconds:g}s"
        if listener is not None:
            listener.settled.wait(Listener.PROBE_SECONDS + 2.0)  # listening, deaf (polling), or lost meanwhile
            pickup = f"{listener.state}, polling every {idle_seconds:g}s as a fallback"
        on_start(f"{concurrency} thread(s); {pickup}")
    watchdog = presence = timetable = bulk_worker = None
    owner = owner or default_owner()
    try:
        if run_id is None and schedules.schedules():  # the slots that have come start first, then get worked
            if waker is None:
                schedules.start_due(clock=clock)
            else:  # a --loop worker also wakes for each slot to come
                timetable = Timetable(waker, clock).start()
        if run_id is None:  # bulk acts: a single pass takes its share first; a --loop worker, in a thread
            if waker is None:
                bulks.drain(clock=clock)
            else:
                bulk_worker = BulkWorker(clock=clock).start()
        with Heartbeat(clock) as heartbeat:
            if report_presence:  # a worker process (resume_runs), not a pass called in-process
                presence = Presence(owner, threads=concurrency, clock=clock, in_hand=lambda: len(heartbeat.held()),
                                    pickup=lambda: listener.state if listener is not None else f"polling every "
                                    f"{idle_seconds:g}s" if waker is not None else "one pass (--once)")
                presence.report()
            watchdog = Watchdog(heartbeat, clock=clock, presence=presence)
            heartbeat.after(watchdog.every, watchdog.start_looking)  # no thread for a pass shorter than that
            pool = WorkerPool(
                concurrency=concurrency, owner=owner, clock=clock, heartbeat=heartbeat,
                lease_seconds=conf.lease_seconds() if lease_seconds is None else lease_seconds, report=report,
                budget=Budget(limit), run_id=run_id, deadline=None if max_seconds is None else began + max_seconds,
                stopping=stopping, waker=waker, idle_seconds=idle_seconds, on_outcome=on_outcome,
                timer=seconds_until_next_due if waker is not None and on_postgresql() else None, on_claim=on_claim,
                queues=tuple(dict.fromkeys(queues)))
            try:
                pool.run(grace=grace)
            finally:
                report.seconds = time.monotonic() - began
    finally:
        if watchdog is not None:
            watchdog.stop()
            report.outlived = [str(step) for step in watchdog.seen.values()]
        if presence is not None:
            presence.report(stopped=True)
        if listener is not None:
            report.pickup = listener.state
            listener.stop()
        if timetable is not None:
            timetable.stop()
        if bulk_worker is not None:
            bulk_worker.stop()
    return report


@dataclass(frozen=True, kw_only=True)
class Preview:
    run_id: str
    boundary: Boundary
    would: str


def preview_due(*, limit: int | None = 100, run_id: str | None = None, clock: Clock | None = None,
                queues: Iterable[str] = ()) -> list[Preview]:
    """Say what a pass would do with each due run (on `queues`, if given), in the order it would take them,
    changing nothing (no claim, no lookup, no step)."""
    now = (clock or store.DATABASE).expression()
    due = RunState.objects.due(now)
    if queues:
        due = due.filter(queue__in=list(queues))
    runs = RunState.objects.filter(pk=run_id).takeable(now) if run_id else due.in_claim_order()
    previews = []
    for run in runs.with_attempts()[:limit]:
        b = boundary_of(run)
        previews.append(Preview(run_id=run.run_id, boundary=b, would=_would(run, b)))
    return previews


def _would(run: RunState, b: Boundary) -> str:
    missing = lacking_of(run, b)
    if missing is None:
        return (f"leave it for a deploy that has its plan {run.plan_fingerprint} (not recorded, and not this "
                f"deploy's), then stop it for staff after the grace period")
    if missing and run.workflow not in workflows():
        return (f"leave it for a deploy that has workflow {run.workflow!r}, then stop it for staff after the "
                f"grace period")
    if missing:
        return (f"leave it for a deploy that has {', '.join(missing)} (this deploy lacks them, or declares "
                f"them with another policy), then stop it for staff after the grace period")
    if not b.remainder:
        return "mark it completed"
    step = get_workflow(run.workflow)[b.remainder[0]]  # it needs steps, and this deploy has every one
    latest = b.latest.get(step.name)
    if latest is None:
        return f"run {step.name} (attempt 1)"
    if latest.status == "failed":
        return f"retry {step.name} (attempt {latest.attempt + 1} of {step.max_attempts})"
    escalation = Escalation.objects.for_attempt(run.run_id, step.name, latest.attempt).select_related(
        "decision").first()
    decision = getattr(escalation, "decision", None) if escalation else None
    verdict = settle_in_doubt(step.policy, attempt=latest, escalation_open=bool(escalation and not decision),
                              staff_outcome=Outcome(decision.action) if decision else None)
    if verdict.action is Action.LOOK_UP:
        return f"look up {step.name} by key {latest.effect_key}, then settle it (in doubt, resolvable)"
    if verdict.action is Action.RUN:
        return f"run {step.name} again (attempt {latest.attempt + 1}): {verdict.reason}"
    return f"{verdict.action.value}: {verdict.reason}"


# -- decisions and staff actions -----------------------------------------------------------------------


def _who(by: Any) -> tuple[str, int | None]:
    if hasattr(by, "get_username"):
        return by.get_username(), by.pk
    if isinstance(by, str) and by.strip():
        return by.strip(), None
    raise InvalidDecision("`by` must be a user or a non-empty name")


def _superuser(by: Any) -> bool:
    """Whether `by` is a superuser: who may decide an inbox item another person holds (recorded as an override)."""
    return bool(getattr(by, "is_superuser", False)) and bool(getattr(by, "is_active", True))


def _required_note(note: Any) -> str:
    if not isinstance(note, str) or not note.strip():
        raise InvalidDecision("a note saying why is required")
    return note.strip()


def resolve_escalation(escalation_id: int, outcome: str, *, by: Any, note: str, result: Any = None
                       ) -> Intervention:
    """Decide an escalation once, recording who, when and why; the next resume_runs acts on it."""
    try:
        chosen = Outcome(outcome)
    except ValueError:
        raise InvalidDecision(f"outcome must be happened, did_not_happen or abandon, not {outcome!r}") from None
    decided_by, user_id = _who(by)
    note = _required_note(note)
    if chosen is not Outcome.HAPPENED and result is not None:
        raise InvalidDecision("a result goes only with 'happened'")
    store.ensure_json(result, what="the decision's result")
    escalation = Escalation.objects.select_related("run").filter(pk=escalation_id).first()
    if escalation is None:
        raise EscalationNotFound(escalation_id=escalation_id)
    cursor = None
    if chosen is Outcome.HAPPENED:
        plan = plan_of(escalation.run)
        cursor = plan.index(escalation.step) + 1 if plan and escalation.step in plan else escalation.run.cursor + 1

    def record() -> Intervention:
        return store.record_decision(escalation.pk, action=chosen.value, decided_by=decided_by, user_id=user_id,
                                     note=note, result=result, cursor=cursor, superuser=_superuser(by))

    traces = tracing_in_use()
    if traces is None:
        decision = record()
    else:
        run = escalation.run
        decision = traces.decide(run_id=run.run_id, workflow=run.workflow, step=escalation.step,
                                  attempt=escalation.attempt, trace_context=run.trace_context,
                                  decision=chosen.value, record=record)
    signals.escalation_was_decided(decision)  # signals: sent now, the decision is committed
    if chosen is Outcome.ABANDON:
        signals.run_finished(decision.run_id, RunStatus.CANCELLED, reason=f"abandoned by {decided_by}: {note}",
                             by=decided_by)
    return decision


def decide(run_id: str, step: str, outcome: str, *, by: Any, note: str, result: Any = None) -> Intervention:
    """Decide the latest escalation of `step` in `run_id`; or, with "approve" or "reject", the approval `step`
    the run waits at."""
    if outcome in APPROVAL_OUTCOMES:
        return decide_approval(run_id, step, approved=outcome == "approve", by=by, note=note, result=result)
    escalation = Escalation.objects.filter(run_id=run_id, step=step).order_by("-attempt").first()
    if escalation is None:
        get_run(run_id)
        raise EscalationNotFound(run_id=run_id, step=step)
    return resolve_escalation(escalation.pk, outcome, by=by, note=note, result=result)


APPROVAL_OUTCOMES = ("approve", "reject")


def open_approvals(*, user: Any = None) -> list[RunStep]:
    """The approval queue: undecided approvals runs wait at, oldest first, each with its run and its attempts;
    with `user`, those of the runs that user may see (durableruns.scopes)."""
    approvals = RunStep.objects.open_approvals()
    if user is not None:
        approvals = approvals.visible_to(user)
    return list(approvals.select_related("run").prefetch_related("run__attempts"))


def wait_steps() -> list[tuple[str, str]]:
    """(step, kind) of every wait step this deploy's workflows declare, sorted: what runs can wait for."""
    return sorted({(s.name, s.kind) for wf in workflows().values() for s in wf.steps if s.wait is not None})


def decide_approval(run_id: str, step: str, *, approved: bool, by: Any, note: str, result: Any = None
                    ) -> Intervention:
    """Approve or reject the approval `step` the run waits at, once (errors.AlreadyDecided after), recording who,
    when and why; the run is due at once."""
    decided_by, user_id = _who(by)
    if result is not None:
        raise InvalidDecision("an approval's decision takes no result: approve or reject, with a note")
    if not isinstance(note, str):
        raise InvalidDecision("the note must be text")
    run = get_run(run_id)
    # Only an approval the run's own plan declares can be approved: an escalated step's attempt is started too,
    # and an approver (who may not settle escalations) must not move it on by "approving" it.
    plan = run_plan(run)
    declared = get_workflow(run.workflow).get(step) if plan is None and run.workflow in workflows() else None
    kind = plan.policy(step) if plan is not None else (declared.kind if declared is not None else None)
    if kind != Kind.APPROVAL:
        raise ApprovalNotFound(f"run {run_id} has no approval {step}: its plan does not declare one",
                               run_id=run_id, step=step)
    return store.record_approval(run_id, step=step, approved=approved, decided_by=decided_by, user_id=user_id,
                                 note=store.storable(note.strip(), limit=2000), superuser=_superuser(by))


def send_event(run_id: str, event: str, payload: Any = None, *, key: str | None = None) -> bool:
    """Record an event for a run (see durableruns.send); True when recorded, False for a key seen before."""
    if not isinstance(event, str) or not event.strip() or len(event) > 200 or not _storable_text(event):
        raise InvalidInput("the event must be a non-empty name of at most 200 characters")
    if key is not None and (not isinstance(key, str) or not key or len(key) > 500 or not _storable_text(key)):
        raise InvalidInput("the key must be a non-empty string of at most 500 characters")
    payload = {} if payload is None else payload
    if not isinstance(payload, dict):
        raise InvalidInput(f"the payload must be a JSON object, not {type(payload).__name__}")
    try:
        store.ensure_json(payload, what="the payload")
    except ResultNotJSON as exc:
        raise InvalidInput(str(exc)) from None
    return store.record_event(run_id, event=event, payload=payload, key=key)


def cancel_run(run_id: str, *, by: Any, note: str) -> Intervention:
    """Stop a run for good; a worker holding it is fenced out by the epoch bump."""
    decided_by, user_id = _who(by)
    note = _required_note(note)
    cancelled = store.record_staff_action(
        run_id, action=Intervention.Action.CANCEL,
        allowed_from=(RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.NEEDS_DECISION,
                      RunStatus.FAILED),
        new_status=RunStatus.CANCELLED, decided_by=decided_by, user_id=user_id, note=note,
    )
    signals.escalation_was_decided(cancelled)  # signals: an open escalation the cancel closed, if any
    signals.run_finished(run_id, RunStatus.CANCELLED, reason=f"cancel by {decided_by}: {note}", by=decided_by)
    return cancelled


def retry_run(run_id: str, *, by: Any, note: str) -> Intervention:
    """Give the step a failed run stopped at (failed, or still in doubt) a fresh count of attempts and crashes;
    the next resume_runs works it. A run stopped for staff after its crash budget is retried the same way; one
    waiting on an open escalation is decided instead."""
    decided_by, user_id = _who(by)
    step, attempt = reading.retry_point(get_run(run_id))
    return store.record_staff_action(
        run_id, action=Intervention.Action.RETRY, allowed_from=reading.RETRYABLE, new_status=RunStatus.PENDING,
        decided_by=decided_by, user_id=user_id, note=_required_note(note), step=step, attempt=attempt,
    )


# -- plans and deploys ---------------------------------------------------------------------------------------


ADOPTABLE = (RunStatus.PENDING, RunStatus.WAITING, RunStatus.NEEDS_DECISION)


def adopt_plan(run_id: str, *, by: Any, note: str) -> Intervention:
    """Move a run to this deploy's plan of its workflow, on purpose, recording who, when, why and from which plan
    to which. Allowed only where the run's record fits that plan (plans.misfit: nothing would be skipped,
    repeated or reordered); otherwise PlanMismatch names the step, and the run is left as it was."""
    decided_by, user_id = _who(by)
    note = _required_note(note)
    run = get_run(run_id)
    workflow = get_workflow(run.workflow)
    if run.status == RunStatus.NEEDS_DECISION and Escalation.objects.filter(
            run_id=run_id, decision__isnull=True).exists():
        raise RunNotActionable("this run waits for a decision on its escalation: decide it first",
                               run_id=run_id, status=run.status)
    return store.adopt_plan(run_id, plan=workflow.as_plan(), allowed_from=ADOPTABLE, decided_by=decided_by,
                            user_id=user_id, note=note)


def reopen_runnable() -> int:
    """Make workable again the runs stopped for staff because a deploy lacked steps of their plan, where this
    deploy has every step they still need: the deploy that has them came back. Returns how many. A worker does
    this itself, once per process, the first time it finds nothing due (store.claim)."""
    return store.reopen_runnable()


@dataclass(frozen=True, kw_only=True)
class MissingStep:
    """A step runs in flight still need that this deploy lacks: what `check --database default` warns of."""

    workflow: str
    step: str
    policy: str
    fingerprint: str
    runs: int


def missing_steps() -> list[MissingStep]:
    """Each step of a plan with unfinished runs that this deploy lacks (or declares with another policy), with
    how many of those runs have not completed it yet."""
    found = []
    for row in RunPlan.objects.in_flight().order_by("workflow", "first_seen"):
        plan = row.to_plan()
        names = RunState.objects.unfinished().of_plan(plan.fingerprint).values_list("workflow", flat=True)
        for workflow_name in sorted(set(names)):
            try:
                have: dict[str, str] | None = get_workflow(workflow_name).policies()
            except UnknownWorkflow:
                have = None
            for step in lacking(plan, have, plan.names):
                runs = (RunState.objects.unfinished().of_plan(plan.fingerprint).filter(workflow=workflow_name)
                        .needing(step).count())
                if runs:
                    found.append(MissingStep(workflow=workflow_name, step=step, policy=plan.policy(step) or "",
                                             fingerprint=plan.fingerprint, runs=runs))
    return found
