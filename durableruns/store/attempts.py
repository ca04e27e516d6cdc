"""A step's attempts: the intent before its effect, its result (with the next intent or the run's end), a
failure, a loop's checkpoint, a raise in a live worker; with their PostgreSQL statements."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connections, transaction

from durableruns import conf, signals
from durableruns.clock import Clock
from durableruns.encoding import storable, to_json
from durableruns.errors import FencedOut
from durableruns.held import Held
from durableruns.models import Resolution, RunState, RunStatus, RunStep, StepStatus
from durableruns.store.attributes import write_attributes
from durableruns.store.base import DATABASE, Intent, Lease, fast, fence, finish_attempt, lease_times
from durableruns.store.children import NewChild, record_children, wake_parent, wake_parent_after
from durableruns.store.sql import WAKE_CHANNEL, Times, one, rowcount, waiting_for_standby

_INTENT_ROW = """
INSERT INTO run_step (run_id, step, attempt, status, effect_key, started_at, held_until, finished_at, result,
                      error, resolution, owner, epoch, loop_cursor, progress)
SELECT run_id, %(i_step)s, %(i_attempt)s, 'started', %(i_key)s, now() + %(shift)s, now() + %(shift)s + %(lease)s,
       NULL, NULL, '', '', %(owner)s, %(epoch)s, %(i_loop)s, %(i_progress)s::jsonb
  FROM fence
"""


# A step's statements move the cursor but leave the lease to the heartbeat (worker.heartbeat renews every lease in
# hand a third of the way through it): they then change no column that any index of run_state names, keys or
# predicates alike (lease_expires_at is in run_state_limit_held_idx's), so PostgreSQL updates the row in place
# (a HOT update: no new entry in any of run_state's indexes, a third of a step's WAL records). The fence is the
# epoch, as ever; the claim and the run's end still set the lease.
_RECORD_INTENT = """
WITH fence AS (
  UPDATE run_state SET cursor = %(cursor)s, updated_at = now() + %(shift)s
   WHERE run_id = %(run)s AND epoch = %(epoch)s
  RETURNING run_id)
""" + _INTENT_ROW

_RESULT_HEAD = """
WITH fence AS (
  UPDATE run_state SET cursor = %(cursor)s, updated_at = now() + %(shift)s{state}
   WHERE run_id = %(run)s AND epoch = %(epoch)s
     AND EXISTS (SELECT 1 FROM run_step
                  WHERE run_id = %(run)s AND step = %(step)s AND attempt = %(attempt)s AND status = 'started')
  RETURNING {returning}),
done AS (
  UPDATE run_step SET status = 'completed', result = %(result)s::jsonb, finished_at = now() + %(shift)s,
         resolution = %(resolution)s
   WHERE run_id = %(run)s AND step = %(step)s AND attempt = %(attempt)s AND status = 'started'
     AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1)
"""
_STILL_RUNNING = ""  # the lease is the heartbeat's (above)
_FINISHED = ", status = 'completed', lease_expires_at = NULL, wake_at = NULL, reason = ''"
# A run's last result also wakes its parent's join (a child run's: durableruns.children), in the same commit, when
# its parent waits and no other child of it may still move as this statement sees them; a statement that saw one
# returns the parent's id, and store.record_result asks once more after the commit (children.wake_parent_after).
# For a run without a parent the wake matches nothing (fence.parent_id is NULL).
_WAKE_PARENT = """
, woke AS (
  UPDATE run_state p SET wake_at = now() + %(shift)s
    FROM fence f
   WHERE p.run_id = f.parent_id AND p.status = 'waiting'
     AND NOT EXISTS (SELECT 1 FROM run_state c
                      WHERE c.parent_id = f.parent_id AND c.run_id <> f.run_id
                        AND c.status IN ('pending', 'running', 'waiting', 'needs_decision'))
  RETURNING p.run_id)
SELECT f.parent_id, (SELECT count(*) FROM woke),
       (SELECT count(pg_notify('""" + WAKE_CHANNEL + """', '')) FROM woke)
  FROM fence f
"""
_RECORD_RESULT = {
    (False, False): _RESULT_HEAD.format(state=_STILL_RUNNING, returning="run_id") + "SELECT 1 FROM fence",
    (False, True): _RESULT_HEAD.format(state=_FINISHED, returning="run_id, parent_id") + _WAKE_PARENT,
    (True, False): _RESULT_HEAD.format(state=_STILL_RUNNING, returning="run_id") + ", intent AS (" + _INTENT_ROW
    + " RETURNING 1) SELECT 1 FROM fence",
}


# Steps that recorded no intent (durableruns.held): their rows are written completed, all in one INSERT from the
# statement's JSON array (the step in hand's last), in the commit that moves the cursor past them; fenced on the
# epoch alone, as they have no started row to find.
_UNRECORDED_HEAD = """
WITH fence AS (
  UPDATE run_state SET cursor = %(cursor)s, updated_at = now() + %(shift)s{state}
   WHERE run_id = %(run)s AND epoch = %(epoch)s
  RETURNING {returning}),
rows AS (
  INSERT INTO run_step (run_id, step, attempt, status, effect_key, started_at, held_until, finished_at, result,
                        error, resolution, owner, epoch, loop_cursor, progress)
  SELECT f.run_id, r.step, r.attempt, 'completed', r.key, now() + %(shift)s, NULL, now() + %(shift)s,
         coalesce(r.result, 'null'), '', r.resolution, %(owner)s, %(epoch)s, 0, '{{}}'::jsonb
    FROM fence f,
         jsonb_to_recordset(%(rows)s::jsonb) AS r(step text, attempt int, key text, result jsonb, resolution text)
  RETURNING 1)
"""
_RECORD_UNRECORDED = {
    (False, False): _UNRECORDED_HEAD.format(state=_STILL_RUNNING, returning="run_id") + "SELECT 1 FROM fence",
    (False, True): _UNRECORDED_HEAD.format(state=_FINISHED, returning="run_id, parent_id") + _WAKE_PARENT,
    (True, False): _UNRECORDED_HEAD.format(state=_STILL_RUNNING, returning="run_id") + ", intent AS ("
    + _INTENT_ROW + " RETURNING 1) SELECT 1 FROM fence",
}


_CHECKPOINT = """
WITH fence AS (
  UPDATE run_state SET updated_at = now() + %(shift)s, lease_expires_at = now() + %(shift)s + %(lease)s
   WHERE run_id = %(run)s AND epoch = %(epoch)s
     AND EXISTS (SELECT 1 FROM run_step
                  WHERE run_id = %(run)s AND step = %(step)s AND attempt = %(attempt)s AND status = 'started')
  RETURNING run_id)
UPDATE run_step SET loop_cursor = %(loop)s, progress = %(progress)s::jsonb, renewed_at = now() + %(shift)s,
       held_until = now() + %(shift)s + %(lease)s
 WHERE run_id = %(run)s AND step = %(step)s AND attempt = %(attempt)s AND EXISTS (SELECT 1 FROM fence)
"""


def _pg_record_intent(*, run: str, epoch: int, owner: str, times: Times, cursor: int, standby: str | None = None,
                  **intent: Any) -> bool:
    """Insert the started row (`intent`: i_step, i_attempt, i_key, i_loop, i_progress) and move the cursor,
    fenced; False if the epoch is stale. With `standby` (a synchronous_commit level) its commit waits for the
    standby (_waiting_for_standby)."""
    params = {"run": run, "epoch": epoch, "owner": owner, "cursor": cursor, **times, **intent}
    if standby is not None:
        return waiting_for_standby(_RECORD_INTENT, params, standby)[1] == 1
    return rowcount(_RECORD_INTENT, params) == 1


def _pg_record_result(*, run: str, epoch: int, owner: str, times: Times, cursor: int, step: str, attempt: int,
                  result: str, resolution: str, finish: bool, intent: dict[str, Any] | None,
                  standby: str | None = None) -> bool | str:
    """Complete the started attempt, move the cursor, and either add the next intent or finish the run; with
    `standby`, the commit (the next intent's) waits for the standby. False if fenced out. A child run's last
    result: its parent's id if the parent is to be asked about once more after the commit (_WAKE_PARENT)."""
    params = {"run": run, "epoch": epoch, "owner": owner, "cursor": cursor, "step": step, "attempt": attempt,
              "result": result, "resolution": resolution, **times}
    return _moved(_RECORD_RESULT, params, finish=finish, intent=intent, standby=standby)


def _moved(statements: dict[tuple[bool, bool], str], params: dict[str, Any], *, finish: bool,
           intent: dict[str, Any] | None, standby: str | None) -> bool | str:
    """Run the variant of `statements` for (a next intent, the run's end): True once the cursor moved, False if
    fenced out, or a child run's parent to ask about once more after the commit (_WAKE_PARENT)."""
    if intent is not None:
        params.update(intent)
    sql = statements[(intent is not None, finish)]
    if standby is not None:
        return waiting_for_standby(sql, params, standby)[0] is not None
    row = one(sql, params)
    if row is None:
        return False
    if finish and row[0] is not None and not row[1]:  # a child that saw a sibling still moving
        return str(row[0])
    return True


def _pg_record_unrecorded(*, run: str, epoch: int, owner: str, times: Times, cursor: int, rows: list[Held],
                          finish: bool, intent: dict[str, Any] | None, standby: str | None = None) -> bool | str:
    """Write `rows` completed (steps that recorded no intent), move the cursor, and either add the next intent or
    finish the run; as _pg_record_result answers."""
    params = {"run": run, "epoch": epoch, "owner": owner, "cursor": cursor, **times, "rows": _rows_json(rows)}
    return _moved(_RECORD_UNRECORDED, params, finish=finish, intent=intent, standby=standby)


def _rows_json(rows: list[Held]) -> str:
    """`rows` as one JSON array, the statement's one parameter for them (psycopg dumps five arrays more slowly than
    this joins them), each result spliced in as the JSON it already is; the statement reads a JSON null result
    back as the null it is (jsonb_to_recordset gives SQL NULL for it)."""
    dumps = json.dumps
    return "[" + ",".join(
        f'{{"step":{dumps(r.step)},"attempt":{r.attempt},"key":{dumps(r.effect_key)},"result":{r.encoded},'
        f'"resolution":{dumps(r.resolution)}}}' for r in rows) + "]"


def _pg_checkpoint(*, run: str, epoch: int, times: Times, step: str, attempt: int, loop: int, progress: str) -> bool:
    """Commit a loop's position inside the started attempt, fenced."""
    return rowcount(_CHECKPOINT, {"run": run, "epoch": epoch, "step": step, "attempt": attempt, "loop": loop,
                                   "progress": progress, **times}) == 1


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


def _standby_level(intent: Intent | None) -> str | None:
    """The synchronous_commit level `intent`'s commit is made with, if not the server's own."""
    if intent is None or not intent.wait_for_standby:
        return None
    return conf.standby_intents()


def _wait_for_standby(level: str | None) -> None:
    """Inside the ORM's transaction about to commit an intent: make its commit wait at `level` (SET LOCAL: this
    transaction only; PostgreSQL reads it when it commits). The one-statement path: sql.waiting_for_standby."""
    db = connections[conf.database()]
    if level is not None and db.vendor == "postgresql":
        with db.cursor() as cursor:
            cursor.execute("SELECT set_config('synchronous_commit', %s, true)", [level])


def _intent_params(intent: Intent) -> dict[str, Any]:
    progress = to_json(intent.progress, what="progress") if intent.progress else "{}"
    return {"i_step": intent.step, "i_attempt": intent.attempt, "i_key": intent.effect_key,
            "i_loop": intent.loop_cursor, "i_progress": progress}


def record_intent(lease: Lease, intent: Intent, *, clock: Clock = DATABASE) -> None:
    """Commit 1: the step is about to act under its effect key, and the run is at this step."""
    level = _standby_level(intent)
    if fast():
        if not _pg_record_intent(run=lease.run_id, epoch=lease.epoch, owner=lease.owner, times=lease_times(lease, clock),
                                   cursor=intent.cursor, standby=level, **_intent_params(intent)):
            raise FencedOut(run_id=lease.run_id, epoch=lease.epoch)
        return
    with transaction.atomic(using=conf.database(), durable=True):
        _wait_for_standby(level)
        fence(lease, clock, cursor=intent.cursor)
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
    attributes: dict[str, Any] | None = None,
    held: Sequence[Held] = (),
) -> None:
    """Commit 2: the step's result and the moved cursor, and in the same commit either the next step's intent
    or, with `finish`, the run's completion; and the child runs the step asked for (`children`), the attributes
    it set (`attributes`, checked already), and the results of earlier steps held for this commit (`held`:
    steps that recorded no intent, durableruns.held), if any.

    Sharing the commit is safe: the next step has not acted yet, and its intent is still durable before it does.
    """
    encoded = to_json(result, what=f"the result of {step}") if encoded is None else encoded
    level = _standby_level(next_intent)
    if not children and not attributes and not (intent_recorded and held) and fast():
        if intent_recorded:
            recorded = _pg_record_result(
                run=lease.run_id, epoch=lease.epoch, owner=lease.owner, times=lease_times(lease, clock),
                cursor=next_intent.cursor if next_intent else cursor, step=step, attempt=attempt, result=encoded,
                resolution=resolution, finish=finish and next_intent is None,
                intent=_intent_params(next_intent) if next_intent else None, standby=level,
            )
        else:
            recorded = _pg_record_unrecorded(
                run=lease.run_id, epoch=lease.epoch, owner=lease.owner, times=lease_times(lease, clock),
                cursor=next_intent.cursor if next_intent else cursor,
                rows=[*held, Held(step=step, attempt=attempt, effect_key=effect_key, encoded=encoded,
                                  resolution=resolution)],
                finish=finish and next_intent is None,
                intent=_intent_params(next_intent) if next_intent else None, standby=level,
            )
        if not recorded:
            why = f"stale epoch, or attempt {attempt} of {step} is no longer started" if intent_recorded else None
            raise FencedOut(why, run_id=lease.run_id, epoch=lease.epoch)
        if isinstance(recorded, str):  # a child's end that saw a sibling still moving: ask once more, now
            wake_parent_after(recorded, clock)
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
        _create_held(lease, held, clock)
        if intent_recorded:
            finish_attempt(lease, step, attempt, status=StepStatus.COMPLETED, result=result,
                    finished_at=clock.expression(), resolution=resolution)
        else:
            RunStep.objects.create(
                run_id=lease.run_id, step=step, attempt=attempt, status=StepStatus.COMPLETED,
                effect_key=effect_key, started_at=clock.expression(), finished_at=clock.expression(),
                result=result, resolution=resolution, owner=lease.owner, epoch=lease.epoch,
            )
        write_attributes(lease.run_id, attributes or {})
        if next_intent is not None:
            _insert_intent(lease, next_intent, clock)
        elif finish:
            wake_parent(lease.run_id, clock)
        if children:
            record_children(lease, children, clock)
    for child in children or ():  # signals
        signals.send_on_commit(signals.run_started, RunState, run_id=child.run_id, workflow=child.workflow)
    if finish and next_intent is None:  # signals
        signals.run_finished(lease.run_id, RunStatus.COMPLETED)


def _create_held(lease: Lease, held: Sequence[Held], clock: Clock) -> None:
    """Inside the commit's transaction: the held results as completed rows (the ORM's way of _UNRECORDED_HEAD)."""
    if held:
        RunStep.objects.bulk_create([
            RunStep(run_id=lease.run_id, step=h.step, attempt=h.attempt, status=StepStatus.COMPLETED,
                    effect_key=h.effect_key, started_at=clock.expression(), finished_at=clock.expression(),
                    result=json.loads(h.encoded), resolution=h.resolution, owner=lease.owner, epoch=lease.epoch)
            for h in held])


def record_held(lease: Lease, held: Sequence[Held], *, cursor: int, clock: Clock = DATABASE) -> None:
    """Commit the results held so far (durableruns.held) and move the cursor to `cursor`, the step in hand's:
    before anything else of the pass is recorded (the step in hand's failure, a release), so that the record
    never shows a later fact without the results before it."""
    if not held:
        return
    if fast():
        if not _pg_record_unrecorded(run=lease.run_id, epoch=lease.epoch, owner=lease.owner,
                                     times=lease_times(lease, clock), cursor=cursor, rows=list(held), finish=False,
                                     intent=None):
            raise FencedOut(run_id=lease.run_id, epoch=lease.epoch)
        return
    with transaction.atomic(using=conf.database(), durable=True):
        fence(lease, clock, cursor=cursor)
        _create_held(lease, held, clock)


def record_failure(lease: Lease, *, step: str, attempt: int, error: str, clock: Clock = DATABASE,
                   intent_recorded: bool = True, effect_key: str = "", detail: str = "") -> None:
    """The far system rejected the call (observed): the attempt is failed, never rewritten; `detail`, the
    traceback's last frames (durableruns.tracebacks), is recorded with the error."""
    error = storable(error)
    with transaction.atomic(using=conf.database(), durable=True):
        fence(lease, clock)
        if intent_recorded:
            finish_attempt(lease, step, attempt, status=StepStatus.FAILED, error=error, finished_at=clock.expression(),
                           error_detail=detail)
        else:
            RunStep.objects.create(
                run_id=lease.run_id, step=step, attempt=attempt, status=StepStatus.FAILED,
                effect_key=effect_key, started_at=clock.expression(), finished_at=clock.expression(), error=error,
                owner=lease.owner, epoch=lease.epoch, error_detail=detail,
            )
    signals.send_on_commit(signals.attempt_failed, RunStep, run_id=lease.run_id, step=step, attempt=attempt,
                           error=error)  # signals


def checkpoint(lease: Lease, *, step: str, attempt: int, loop_cursor: int, progress: dict[str, Any],
               clock: Clock = DATABASE) -> None:
    """Commit a loop's position and progress inside the started attempt (which was alive then, too)."""
    encoded = to_json(progress, what=f"the progress of {step}")
    if fast():
        if not _pg_checkpoint(run=lease.run_id, epoch=lease.epoch, times=lease_times(lease, clock), step=step,
                                attempt=attempt, loop=loop_cursor, progress=encoded):
            raise FencedOut(f"stale epoch, or attempt {attempt} of {step} is no longer started",
                            run_id=lease.run_id, epoch=lease.epoch)
        return
    with transaction.atomic(using=conf.database(), durable=True):
        fence(lease, clock)
        moved = RunStep.objects.filter(
            run_id=lease.run_id, step=step, attempt=attempt, status=StepStatus.STARTED
        ).update(loop_cursor=loop_cursor, progress=progress, renewed_at=clock.expression(),
                 held_until=clock.expression(lease.duration))
        if not moved:
            raise FencedOut(f"attempt {attempt} of {step} is no longer started", run_id=lease.run_id,
                            epoch=lease.epoch)


def record_raised(lease: Lease, *, step: str, attempt: int, clock: Clock = DATABASE, detail: str = "") -> datetime:
    """Record, on the database's clock, that the started attempt raised in its live worker and stays in doubt
    (with `detail`, the traceback's last frames); return that moment. Its call was over by then, so every later
    pass bounds the call by it (policies.last_call_bound). FencedOut if another worker took the run."""
    with transaction.atomic(using=conf.database(), durable=True):
        fence(lease, clock)
        now = clock.now()
        moved = RunStep.objects.filter(
            run_id=lease.run_id, step=step, attempt=attempt, status=StepStatus.STARTED
        ).update(raised_at=now, error_detail=detail)
        if not moved:
            raise FencedOut(f"attempt {attempt} of {step} is no longer started", run_id=lease.run_id,
                            epoch=lease.epoch)
    return now
