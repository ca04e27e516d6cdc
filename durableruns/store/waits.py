"""Runs that wait (durableruns.waits): a wait is a started attempt, a status and a wake time; the events sent
to runs and the approvals decided for them, which make a waiting run due; with their PostgreSQL statements."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, transaction

from durableruns import conf
from durableruns.clock import Clock, as_django, on_postgresql
from durableruns.encoding import storable, to_json
from durableruns.errors import AlreadyDecided, ApprovalNotFound, FencedOut, RunNotActionable, RunNotFound
from durableruns.models import Intervention, RunEvent, RunState, RunStatus, RunStep, StepStatus
from durableruns.store.base import (
    DATABASE,
    ENDED,
    Lease,
    decoded,
    fast,
    fence,
    finish_attempt,
    lease_times,
    wake_workers,
)
from durableruns.store.inbox import Opening, guard_decision, open_item
from durableruns.store.sql import WAKE_CHANNEL, Times, one

# A wait's completion (durableruns.waits): the run's row is fenced on the epoch and on what the completion needs
# still standing (the wait's attempt started, or none recorded yet if it completes as it is reached; the event
# not consumed); the attempt's result and the event's consumption follow from the fence in the same statement,
# its own commit. Under the fence's row lock no other writer of this run moves (each is fenced on the run's row
# first), so the three are recorded together or, fenced out, none is.
_COMPLETE_WAIT_HEAD = """
WITH fence AS (
  UPDATE run_state SET cursor = %(cursor)s, updated_at = now() + %(shift)s,
         lease_expires_at = now() + %(shift)s + %(lease)s
   WHERE run_id = %(run)s AND epoch = %(epoch)s
     AND {attempt}
     AND (%(event_id)s::bigint IS NULL OR EXISTS (
           SELECT 1 FROM run_event WHERE id = %(event_id)s AND run_id = %(run)s AND consumed_at IS NULL))
  RETURNING run_id),
used AS (
  UPDATE run_event SET consumed_step = %(step)s, consumed_attempt = %(attempt)s, consumed_at = now() + %(shift)s
   WHERE id = %(event_id)s AND run_id = %(run)s AND consumed_at IS NULL AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1),
"""
_BEGUN = """EXISTS (SELECT 1 FROM run_step
                  WHERE run_id = %(run)s AND step = %(step)s AND attempt = %(attempt)s AND status = 'started')"""
_NOT_BEGUN = """NOT EXISTS (SELECT 1 FROM run_step WHERE run_id = %(run)s AND step = %(step)s AND attempt = %(attempt)s)"""
_COMPLETE_WAIT = {
    True: _COMPLETE_WAIT_HEAD.format(attempt=_BEGUN) + """done AS (
  UPDATE run_step SET status = 'completed', result = %(result)s::jsonb, finished_at = now() + %(shift)s,
         resolution = %(resolution)s
   WHERE run_id = %(run)s AND step = %(step)s AND attempt = %(attempt)s AND status = 'started'
     AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1)
SELECT (SELECT count(*) FROM fence), (SELECT count(*) FROM done), (SELECT count(*) FROM used)
""",
    False: _COMPLETE_WAIT_HEAD.format(attempt=_NOT_BEGUN) + """done AS (
  INSERT INTO run_step (run_id, step, attempt, status, effect_key, started_at, held_until, finished_at, result,
                        error, resolution, owner, epoch, loop_cursor, progress)
  SELECT run_id, %(step)s, %(attempt)s, 'completed', %(key)s, now() + %(shift)s, NULL, now() + %(shift)s,
         %(result)s::jsonb, '', %(resolution)s, %(owner)s, %(epoch)s, 0, '{}'::jsonb
    FROM fence
  RETURNING 1)
SELECT (SELECT count(*) FROM fence), (SELECT count(*) FROM done), (SELECT count(*) FROM used)
""",
}

# An event sent to a run (store.record_event, in a transaction that holds the run's row): inserted unless the run
# has one with its key already, and a run waiting for an event of its name made due at once, waking idle workers
# when the transaction commits. Its times are the statement's: the caller's transaction may have begun long ago.
_RECORD_EVENT = """
WITH sent AS (
  INSERT INTO run_event (run_id, event, key, payload, sent_at, consumed_step)
  VALUES (%(run)s, %(event)s, %(key)s, %(payload)s::jsonb, statement_timestamp() + %(shift)s, '')
  ON CONFLICT (run_id, key) WHERE key IS NOT NULL DO NOTHING
  RETURNING id),
woke AS (
  UPDATE run_state SET wake_at = statement_timestamp() + %(shift)s
   WHERE run_id = %(run)s AND status = 'waiting' AND EXISTS (SELECT 1 FROM sent)
     AND EXISTS (SELECT 1 FROM run_step
                  WHERE run_id = %(run)s AND status = 'started' AND progress -> 'event' = to_jsonb(%(event)s::text))
  RETURNING 1)
SELECT (SELECT count(*) FROM sent), (SELECT count(pg_notify('""" + WAKE_CHANNEL + """', '')) FROM woke)
"""

# What a wait_for asks as it is worked (engine): the database's now and the oldest event of its name not consumed.
_NOW_AND_OLDEST_EVENT = """
SELECT clock_timestamp() + %(shift)s, e.id, e.payload
  FROM (VALUES (1)) AS one
  LEFT JOIN LATERAL (SELECT id, payload FROM run_event
                      WHERE run_id = %(run)s AND event = %(event)s AND consumed_at IS NULL
                      ORDER BY sent_at, id LIMIT 1) e ON true
"""


def _pg_complete_wait(*, run: str, epoch: int, owner: str, times: Times, cursor: int, step: str, attempt: int,
                  begun: bool, key: str, result: str, resolution: str, event_id: int | None) -> bool:
    """Complete the wait `step` (its started attempt if `begun`, else a completed attempt inserted), move the
    cursor past it and consume the event `event_id` (None: none), in one statement; False if fenced out (a stale
    epoch, the attempt no longer as expected, or the event consumed already), when nothing is recorded."""
    row = one(_COMPLETE_WAIT[begun], {"run": run, "epoch": epoch, "owner": owner, "cursor": cursor, "step": step,
                                       "attempt": attempt, "key": key, "result": result, "resolution": resolution,
                                       "event_id": event_id, **times})
    return bool(row[0] == 1 and row[1] == 1 and row[2] == (0 if event_id is None else 1))


def _pg_record_event(*, run: str, event: str, key: str | None, payload: str, shift: timedelta) -> bool:
    """Insert an event (`payload` as JSON text) into the caller's transaction, which holds the run's row, and make
    the run due if it waits for one of that name; False (nothing written) if the run has an event with `key`."""
    row = one(_RECORD_EVENT, {"run": run, "event": event, "key": key, "payload": payload, "shift": shift})
    return bool(row[0])


def _pg_now_and_oldest_event(*, run: str, event: str, shift: timedelta) -> tuple[datetime, tuple[int, Any] | None]:
    """The database's now (moved by `shift`) and the oldest event of that name the run has not consumed, as
    (id, payload) or None: one round trip."""
    now, event_id, payload = one(_NOW_AND_OLDEST_EVENT, {"run": run, "event": event, "shift": shift})
    return now, None if event_id is None else (event_id, payload)


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
         detail: dict[str, Any] | None = None, inbox: Opening | None = None, clock: Clock = DATABASE) -> None:
    """Hand the run back waiting at the wait `step` until `until` (None: until something is sent or decided),
    holding no lease; with `detail`, first begin the wait: its started attempt records what it waits for and
    until when, once (an approval's with its inbox item, `inbox`). One commit.

    The run's row is updated first (on PostgreSQL its lock; on SQLite the write lock), then the record is read
    again: an event or decision that committed before is seen, and the run is due at once; one committing after
    finds the run waiting and makes it due itself (record_event, record_approval, a child's end: wake_parent).
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
            if inbox is not None:
                open_item(run_id=lease.run_id, step=step, attempt=attempt, kind="approval", opening=inbox,
                          clock=clock)
        if _came(lease.run_id, event=event, approval=approval, step=step, attempt=attempt, join=join):
            RunState.objects.filter(pk=lease.run_id).update(wake_at=clock.expression())
        wake_workers()  # idle workers learn the wake time (their timer), or take it now


def complete_wait(lease: Lease, *, step: str, attempt: int, begun: bool, effect_key: str, result: Any,
                  resolution: str, cursor: int, event_id: int | None = None, clock: Clock = DATABASE) -> None:
    """Complete the wait `step` with `result` (inserting its attempt if it never began), and consume the event
    `event_id` for it: one commit, so an event is consumed exactly when a wait completes with it."""
    encoded = to_json(result, what=f"the result of {step}")
    if fast():
        if not _pg_complete_wait(run=lease.run_id, epoch=lease.epoch, owner=lease.owner, times=lease_times(lease, clock),
                                   cursor=cursor, step=step, attempt=attempt, begun=begun, key=effect_key,
                                   result=encoded, resolution=resolution, event_id=event_id):
            raise FencedOut(f"stale epoch, attempt {attempt} of {step} not as it was, or event {event_id} consumed "
                            f"already", run_id=lease.run_id, epoch=lease.epoch)
        return
    with transaction.atomic(using=conf.database(), durable=True):
        fence(lease, clock, cursor=cursor)
        if begun:
            finish_attempt(lease, step, attempt, status=StepStatus.COMPLETED, result=json.loads(encoded),
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
        now, row = _pg_now_and_oldest_event(run=run_id, event=event, shift=clock.shift)
        return as_django(now), None if row is None else (row[0], decoded(row[1]) or {})
    row = (RunEvent.objects.filter(run_id=run_id, event=event, consumed_at__isnull=True)
           .order_by("sent_at", "id").values_list("id", "payload").first())
    return clock.now(), None if row is None else (row[0], row[1] or {})


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
        row = RunState.objects.select_for_update().filter(pk=run_id).values_list("status", "ending").first()
        if row is None:
            raise RunNotFound(run_id=run_id)
        status, ending = row
        if status in ENDED:
            raise RunNotActionable(f"the run is {status}: it waits for nothing", run_id=run_id, status=status)
        if ending:  # giving back what it holds before it ends: no wait of it will ever consume the event
            raise RunNotActionable(f"the run is being {ending} (giving back what it holds): it waits for nothing",
                                   run_id=run_id, status=status)
        if on_postgresql():  # one statement: ON CONFLICT keeps the caller's transaction whole, no savepoint
            return _pg_record_event(run=run_id, event=event, key=key, payload=encoded, shift=clock.shift)
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
            wake_workers()
    return True


def record_approval(run_id: str, *, step: str, approved: bool, decided_by: str, user_id: int | None, note: str,
                    superuser: bool = False, clock: Clock = DATABASE) -> Intervention:
    """Decide the approval `step` the run waits at, once: the decision is its own row (who, when, why), and the
    run is due at once. A second decision raises AlreadyDecided (the unique index settles a race); one by
    anyone but the holder of its inbox item raises ItemTaken and records nothing (a superuser's is an override)."""
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
        guard_decision(run_id=run_id, step=step, attempt=latest[0], decided_by=decided_by, user_id=user_id,
                       superuser=superuser, now=now)
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
        wake_workers()
    return decision


def _already(first: Intervention) -> AlreadyDecided:
    return AlreadyDecided(
        f"already decided by {first.decided_by} at {first.decided_at:%Y-%m-%d %H:%M:%S}: {first.get_action_display()}",
        run_id=first.run_id, step=first.step, decided_by=first.decided_by, decided_at=first.decided_at)
