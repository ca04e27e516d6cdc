"""The claim: a worker takes the due run of highest priority in one statement (on PostgreSQL, with its attempts
and, for a fresh run, its first step's intent), under the deploy's concurrency limits; with the statements."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import Any

from django.db import DataError, IntegrityError, connections, transaction
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models import F

from durableruns import conf
from durableruns.boundary import StepAttempt
from durableruns.clock import Clock, on_postgresql
from durableruns.distribution import is_distributed
from durableruns.limits import PARKED
from durableruns.models import RunState, RunStatus
from durableruns.registry import FirstSteps, generation, get_workflow, limits
from durableruns.store import spread
from durableruns.store.base import DATABASE, TAKEOVER_COUNT, TAKEOVERS, Claimed, Intent, Lease, decoded, fast
from durableruns.store.runs import reopen_runnable
from durableruns.store.sql import Times, hot_path

# Highest priority first, then the one due first, by walking run_state_ready_idx (priority DESC, created_at) in its
# order, and the waiting runs by run_state_wake_idx in wake order: the first unlocked due row ends each scan,
# however many runs are due. Left to its statistics, PostgreSQL may instead fetch every due run and sort
# them, at each claim, which makes draining a backlog quadratic: it does so whenever the statistics say almost
# nothing is due while thousands of runs are (after the tables were emptied and refilled, 10,000 runs drained
# 17% slower). SET LOCAL holds for the claim's own transaction only.
CLAIM_PLANNING = "SET LOCAL enable_sort = off;\n"

# When the next run comes due by itself (a wake time, a lease running out), in seconds from the database's now; NULL
# if none will. An idle worker thread waits no longer than that (durableruns.worker.listener).
NEXT_DUE = """extract(epoch FROM least(
         (SELECT min(wake_at) FROM run_state WHERE status = 'waiting'),
         (SELECT min(lease_expires_at) FROM run_state WHERE status = 'running')) - (now() + %(shift)s))"""

# A worker limited to some queues (resume_runs --queue) claims with the same statement plus this filter, as a
# statement of its own: the default claim keeps its plan, with no parameter that stands for "every queue".
_IN_QUEUES = "\n            AND queue = ANY(%(queues)s::text[])"

# The due run of two probes: the pending (or abandoned) run of highest priority, the oldest among equals, walking
# run_state_ready_idx, and the waiting run whose wake time came first (the first recorded among equals), walking
# run_state_wake_idx: runs asleep (any number, holding nothing) are never walked past. Each probe locks at most one
# row, skipping locked ones. Between the two, at the same priority, the one due first comes first: a woken run
# was due at its wake time, a ready one when it was recorded (_WOKEN_FIRST); the ORM claim orders so too
# (RunStateQuerySet.claimable), so SQLite and PostgreSQL start runs in one order.
_PROBES = """
         WITH ready AS MATERIALIZED (
           SELECT run_id, priority, created_at, status, workflow, concurrency_key, deadline_at FROM run_state
            WHERE status IN ('pending', 'running')
              AND (status = 'pending' OR lease_expires_at < now() + %(shift)s){queues}{skip}
            ORDER BY priority DESC, created_at LIMIT 1 FOR UPDATE SKIP LOCKED),
         woken AS MATERIALIZED (
           SELECT run_id, priority, created_at, wake_at, status, workflow, concurrency_key, deadline_at FROM run_state
            WHERE status = 'waiting' AND wake_at <= now() + %(shift)s{queues}{skip}
            ORDER BY wake_at, created_at LIMIT 1 FOR UPDATE SKIP LOCKED)"""

# The first of the two in the claim's order, compared without a sort (a sort under the claim's enable_sort = off
# would cost the plan so much that PostgreSQL compiled it with JIT, seconds per claim).
_WOKEN_FIRST = ("coalesce(w.run_id IS NOT NULL AND (r.run_id IS NULL OR w.priority > r.priority"
                " OR (w.priority = r.priority AND (w.wake_at < r.created_at"
                " OR (w.wake_at = r.created_at AND w.created_at < r.created_at)))), false)")

TAKE = """UPDATE run_state SET status = 'running', owner = %(owner)s, epoch = epoch + 1,
         lease_expires_at = now() + %(shift)s + %(lease)s, wake_at = NULL, updated_at = now() + %(shift)s,
         debounce_key = NULL, """ + TAKEOVERS
RETURNING = """RETURNING run_id, epoch, workflow, plan_fingerprint, input, cursor, ending, created_at, priority,
            trace_context, key_run_id, deadline_at, takeovers"""

# Without concurrency limits in this deploy: take the chosen run.
_CLAIMED = """
WITH claimed AS (
  """ + TAKE + """
   WHERE run_id = (""" + _PROBES + """
         SELECT CASE WHEN """ + _WOKEN_FIRST + """ THEN w.run_id ELSE r.run_id END
           FROM (VALUES (1)) AS one LEFT JOIN ready r ON true LEFT JOIN woken w ON true)
  """ + RETURNING + """),
parked AS (SELECT NULL::text AS run_id WHERE false),"""

# With concurrency limits (Workflow(concurrency=, concurrency_key=)): `limits` maps each limited workflow of this
# deploy to its limit; a run counts under (its workflow, the key it recorded at start). The chosen run, if it is
# limited and does not already hold a slot (a running run whose worker died keeps its slot, and is taken over
# as ever), is admitted by durableruns_admit (migration 0017) or parked instead: the same statement, no round trip.
#
# Why admission cannot simply count the key's running runs here: two claimers whose statements began together
# share a snapshot, each counts 2 running of a limit of 3, and both take one: 4. A lock alone does not mend it:
# a lock taken inside this statement leaves its snapshot as old as the statement, so the second claimer, once
# the first has committed and let go, still counts 2. durableruns_admit is a VOLATILE function: it takes a
# transaction-scoped advisory lock on (workflow, key) and only then counts, in a statement of its own with a
# snapshot of its own (READ COMMITTED gives each statement of a volatile function a new one), which sees every
# claim of the key committed before it got the lock; the lock is held until this claim commits, so the next
# claimer of the key counts this one. Claims of different keys never wait for each other.
#
# A run refused a slot is parked: waiting, with no wake time and the reason limits.PARKED, so that no probe walks
# it again (it is in neither probe's index range: with 10,000 parked, bench.limits measured a claim at 0.90 x the
# time and 1.10 x the buffers of one with none). Whatever moves a run of
# the key out of running (its end, a wait, an escalation, a staff act) lets the first parked run of the key go
# (pending), by the trigger run_state_slot_freed, under the same lock: a run is parked only while the key's
# slots are all held by running runs, and each of those lets one go when it leaves; a claim admitted with room
# to spare lets one more go (a limit raised by a deploy fills up).
#
# A run someone else ended while its worker may be inside a far call (a staff cancel, its ancestor's) keeps the
# lease it had, and holds its slot until that worker, fenced out, lets go (store.runs.let_go, whose trigger
# run_state_slot_let_go lets the first parked run go) or the lease runs out: the limit means no overlap at the far
# system, not only no overlap of leases. Nothing happens when a lease runs out, so a run refused for such a slot
# is parked with that lease's end as its wake time (durableruns_held_until, migration 0021): the woken probe takes
# it then.
_CLAIMED_LIMITED = """
WITH chosen AS MATERIALIZED (""" + _PROBES + """
  SELECT CASE WHEN wf THEN w.run_id ELSE r.run_id END AS run_id,
         CASE WHEN wf THEN w.status ELSE r.status END AS status,
         CASE WHEN wf THEN w.workflow ELSE r.workflow END AS workflow,
         CASE WHEN wf THEN w.concurrency_key ELSE r.concurrency_key END AS concurrency_key,
         CASE WHEN wf THEN w.deadline_at ELSE r.deadline_at END AS deadline_at
    FROM (VALUES (1)) AS one LEFT JOIN ready r ON true LEFT JOIN woken w ON true,
         LATERAL (SELECT """ + _WOKEN_FIRST + """ AS wf) AS pick),
verdict AS MATERIALIZED (
  SELECT c.run_id, c.workflow AS limited_workflow, c.concurrency_key AS limited_key,
         CASE WHEN c.status = 'running' OR c.concurrency_key IS NULL OR %(limits)s::jsonb ->> c.workflow IS NULL
                   OR c.deadline_at <= now() + %(shift)s  -- past its deadline: taken to be ended, never parked
              THEN true
              ELSE durableruns_admit(c.workflow, c.concurrency_key, (%(limits)s::jsonb ->> c.workflow)::int,
                                     c.run_id, %(shift)s) END AS admitted
    FROM chosen c WHERE c.run_id IS NOT NULL),
taken AS (
  UPDATE run_state SET status = CASE WHEN v.admitted THEN 'running' ELSE 'waiting' END,
         owner = CASE WHEN v.admitted THEN %(owner)s ELSE owner END,
         epoch = CASE WHEN v.admitted THEN epoch + 1 ELSE epoch END,
         lease_expires_at = CASE WHEN v.admitted THEN now() + %(shift)s + %(lease)s END,
         wake_at = CASE WHEN v.admitted THEN NULL
                        ELSE durableruns_held_until(v.limited_workflow, v.limited_key, v.run_id, %(shift)s) END,
         debounce_key = CASE WHEN v.admitted THEN NULL ELSE run_state.debounce_key END,
         reason = CASE WHEN v.admitted THEN run_state.reason ELSE '""" + PARKED + """' END,
         updated_at = now() + %(shift)s,
         takeovers = CASE WHEN v.admitted THEN """ + TAKEOVER_COUNT + """ ELSE run_state.takeovers END,
         takeover_cursor = CASE WHEN v.admitted THEN run_state.cursor ELSE run_state.takeover_cursor END
    FROM verdict v WHERE run_state.run_id = v.run_id
  RETURNING run_state.run_id, epoch, workflow, plan_fingerprint, input, cursor, ending, created_at, priority,
            trace_context, key_run_id, run_state.deadline_at, takeovers, v.admitted),
claimed AS (SELECT * FROM taken WHERE admitted),
parked AS (SELECT run_id FROM taken WHERE NOT admitted),"""

# A claimed run's attempts, as JSON (attempt_of reads each).
ATTEMPTS = """(SELECT coalesce(json_agg(json_build_object(
                 'step', s.step, 'attempt', s.attempt, 'status', s.status, 'effect_key', s.effect_key,
                 'started_at', s.started_at, 'finished_at', s.finished_at, 'renewed_at', s.renewed_at,
                 'held_until', s.held_until, 'raised_at', s.raised_at, 'loop_cursor', s.loop_cursor,
                 'progress', s.progress, 'result', s.result, 'error', s.error)), '[]'::json)
          FROM run_step s WHERE s.run_id = c.run_id)"""

# The first intents of the fresh runs claimed (of a workflow this deploy has, under the same plan), {lead} the
# filter of a claim that gives it to one of them only (store.prefetch).
FIRST_INTENT = """
  INSERT INTO run_step (run_id, step, attempt, status, effect_key, started_at, held_until, finished_at, result,
                        error, resolution, owner, epoch, loop_cursor, progress)
  SELECT c.run_id, f.step, 1, 'started', coalesce(c.key_run_id, c.run_id) || ':' || f.step, now() + %(shift)s,
         now() + %(shift)s + %(lease)s, NULL, NULL, '', '', %(owner)s, c.epoch, 0, '{}'::jsonb
    FROM claimed c
    JOIN jsonb_to_recordset(%(first_steps)s::jsonb) AS f(workflow text, fingerprint text, step text)
      ON f.workflow = c.workflow AND f.fingerprint = c.plan_fingerprint
   WHERE c.cursor = 0{lead} AND NOT EXISTS (SELECT 1 FROM run_step s WHERE s.run_id = c.run_id)"""

_CLAIM_TEMPLATE = """{claimed}
-- A fresh run (no attempt yet) of a workflow this deploy has, under the same plan: its first step's intent
-- rides on the claim's commit, as each later step's rides on the result before it.
first AS (""" + FIRST_INTENT.replace("{lead}", "") + """
  RETURNING step, effect_key)
SELECT c.run_id, c.epoch, c.workflow, c.plan_fingerprint, c.input,
       -- the run's attempts ride on the claim (as they were before it): the boundary needs them first
       """ + ATTEMPTS + """,
       (SELECT step FROM first), (SELECT effect_key FROM first), c.ending,
       -- nothing claimed: the thread goes idle, and its timer needs when the next run comes due by itself (read
       -- here, in the same round trip; a CASE branch not taken runs none of its subqueries)
       CASE WHEN c.run_id IS NULL AND %(hints)s THEN """ + NEXT_DUE + """ END,
       -- a run taken: whether another was due behind it (in the same index order, as this statement saw the
       -- record), so that the thread wakes another idle one only then (worker.pool); one committed since
       -- notifies on its own. Behind it: a ready run of the same priority and not older, or of a lower priority
       -- (two ranges of run_state_ready_idx, each one an index condition), or a waiting run whose time has come.
       CASE WHEN c.run_id IS NOT NULL AND %(hints)s THEN EXISTS (
         SELECT 1 FROM run_state o
          WHERE o.status IN ('pending', 'running')
            AND o.priority = c.priority AND o.created_at >= c.created_at AND o.run_id <> c.run_id
            AND {other_ready}) OR EXISTS (
         SELECT 1 FROM run_state o
          WHERE o.status IN ('pending', 'running') AND o.priority < c.priority AND {other_ready}) OR EXISTS (
         SELECT 1 FROM run_state o
          WHERE o.status = 'waiting' AND o.wake_at <= now() + %(shift)s AND o.run_id <> c.run_id{other_queues})
       END,
       -- the trace the run continues (durableruns.tracing; NULL unless started with the [otel] extra)
       c.trace_context, c.key_run_id,
       -- the run parked by its concurrency limit instead (nothing claimed): the caller claims again
       (SELECT run_id FROM parked),
       -- whether its deadline has passed (durableruns.deadlines): the engine then ends it
       coalesce(c.deadline_at <= now() + %(shift)s, false),
       -- the claims in a row that took it over from a dead worker (TAKEOVERS)
       c.takeovers
  FROM (VALUES (1)) AS one LEFT JOIN claimed c ON true
"""
_OTHER_READY = """(o.status = 'pending' OR o.lease_expires_at < now() + %(shift)s){other_queues}"""
_CLAIM_TEMPLATE = _CLAIM_TEMPLATE.replace("{other_ready}", _OTHER_READY)


# A pass that leaves out runs it already worked (store.claim's `skip`) claims with this filter too.
_SKIPPING = "\n            AND run_id <> ALL(%(skip)s::text[])"


def _claim_text(*, in_queues: bool, hints: bool, skipping: bool, limited: bool = False) -> str:
    """The claim's text for a worker limited to queues or not, whose idle threads wait on a waker (hints) or not,
    in a pass that leaves some runs out (skipping) or not, in a deploy with concurrency limits (limited) or not:
    each a statement of its own, so the usual claim keeps its plan and pays nothing for the others.

    `hints` is spelled in the text, not passed: PostgreSQL then folds the branches not taken out of every plan,
    the generic one it caches included. As a parameter they stay in the generic plan, costed, while the custom
    plans of a claim without hints drop them: once the index walk is cheap (as it is in priority order), the
    generic plan never looks as good as the custom ones, and every claim is planned anew."""
    text = _CLAIM_TEMPLATE.replace("{claimed}", _CLAIMED_LIMITED if limited else _CLAIMED)
    return variant(text, in_queues=in_queues, skipping=skipping).replace("%(hints)s", "true" if hints else "false")


def variant(text: str, *, in_queues: bool, skipping: bool) -> str:
    """A claim's `text` with its {queues} and {skip} filters spelled out, or left out."""
    queues = _IN_QUEUES if in_queues else ""
    text = text.replace("{queues}", queues).replace("{other_queues}", queues.replace("AND q", "AND o.q"))
    return text.replace("{skip}", _SKIPPING if skipping else "")


CLAIMS = {(in_queues, hints, skipping): _claim_text(in_queues=in_queues, hints=hints, skipping=skipping)
           for in_queues in (False, True) for hints in (False, True) for skipping in (False, True)}
# The same, in a deploy that declares concurrency limits.
LIMITED_CLAIMS = {key: _claim_text(in_queues=key[0], hints=key[1], skipping=key[2], limited=True) for key in CLAIMS}
CLAIM = CLAIMS[False, True, False]  # every queue, with hints: what a --loop worker sends


Claim = tuple[str, int, str, str, Any, Any, "str | None", "str | None", str, Any, "str | None", bool, int]


def _pg_claim(*, owner: str, times: Times, first_steps: str,
          before_commit: Callable[[str], None] | None = None, hints: bool = False,
          queues: tuple[str, ...] = (), skip: Collection[str] = (), limits: str | None = None) -> Claim | None:
    """Take the due run of highest priority (the one due first among equals) in one statement, with its attempts; SKIP
    LOCKED lets any number of workers scan at once. With `queues`, only a run on one of them; `skip`, runs this
    pass leaves out (store.claim). A fresh run of a workflow in `first_steps` (JSON: workflow, fingerprint, step)
    gets its first
    step's intent in the same commit; the row ends with that step and its effect key, or two NULLs.

    The statement always runs in a transaction of its own with CLAIM_PLANNING, so every plan PostgreSQL makes
    for it (custom, generic, or again after an ANALYZE) walks the index. `before_commit(step)` (fault injection)
    is called with the transaction still open when a first intent rode on the claim: nothing is recorded yet.

    With `hints` (a worker whose idle threads wait on a waker) the row also says when the next run comes due by
    itself (nothing claimed) or whether another was due behind the one taken (next_due_from_last_claim,
    more_due_after_last_claim); without, neither subquery runs, and a --once pass pays nothing for them.

    With `limits` (JSON: each limited workflow of this deploy -> its limit) the chosen run is admitted under its
    limit or parked instead (_CLAIMED_LIMITED): then nothing is claimed, and parked_by_last_claim() names it."""
    import psycopg

    params: dict[str, Any] = {"owner": owner, "first_steps": first_steps, "hints": hints, **times}
    statement = (LIMITED_CLAIMS if limits else CLAIMS)[bool(queues), hints, bool(skip)]
    if limits:
        params["limits"] = limits
    if queues:
        params["queues"] = list(queues)
    if skip:
        params["skip"] = sorted(skip)
    db = connections[conf.database()]
    setattr(db, _NEXT_DUE_ATTRIBUTE, None)
    setattr(db, _MORE_DUE_ATTRIBUTE, None)
    setattr(db, _PARKED_ATTRIBUTE, None)
    hot = hot_path()
    db.ensure_connection()
    raw = db.connection
    with db.wrap_database_errors:
        try:
            if hot is None:
                # One query string, client-side binding, through a cursor wrapped as Django wraps its own (so
                # the query log shows it); its statements share one transaction, left open for before_commit.
                opening = ["BEGIN;\n"] if before_commit is not None else []
                wrapper = CursorDebugWrapper if db.queries_logged else CursorWrapper
                with wrapper(psycopg.ClientCursor(raw), db) as cursor:
                    cursor.execute("".join(opening) + CLAIM_PLANNING + statement, params)
                    for _ in range(len(opening) + 1):  # past the empty results of BEGIN and SET, to the claim's
                        cursor.nextset()
                    row = cursor.fetchone()
            else:
                # Prepared, in a pipeline: BEGIN, the setting, the claim (and COMMIT) go in one round trip.
                with raw.pipeline():
                    raw.execute("BEGIN")
                    raw.execute(CLAIM_PLANNING)
                    hot.cursor.execute(hot.text(statement), params)
                    if before_commit is None:
                        raw.execute("COMMIT")
                row = hot.cursor.fetchone()
            if raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                if before_commit is not None and row is not None and row[6] is not None:
                    before_commit(row[6])
                raw.execute("COMMIT")
        except BaseException:
            if not raw.closed and raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                raw.execute("ROLLBACK")
            raise
    if row is None:
        return None
    if row[0] is None:  # nothing was due (or it was parked): the row carries NEXT_DUE alone
        setattr(db, _PARKED_ATTRIBUTE, row[13])
        if hints:
            setattr(db, _NEXT_DUE_ATTRIBUTE, (time.monotonic(), row[9]))
        return None
    if hints:
        setattr(db, _MORE_DUE_ATTRIBUTE, bool(row[10]))
    return (row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8] or "", row[11], row[12],
            bool(row[14]), row[15] or 0)


_NEXT_DUE_ATTRIBUTE = "durableruns_next_due"  # on Django's connection wrapper, which is per thread
_PARKED_ATTRIBUTE = "durableruns_parked"
_NEXT_DUE_FRESH_SECONDS = 0.1
_MORE_DUE_ATTRIBUTE = "durableruns_more_due"


def parked_by_last_claim() -> str | None:
    """The run this thread's last claim parked by its concurrency limit instead of taking it, or None."""
    return getattr(connections[conf.database()], _PARKED_ATTRIBUTE, None)


def more_due_after_last_claim() -> bool:
    """Whether another run was due behind the one this thread's last claim took, as that claim saw the record;
    True where it is not known (the claim went another way, or took nothing), taken once."""
    db = connections[conf.database()]
    more = getattr(db, _MORE_DUE_ATTRIBUTE, None)
    setattr(db, _MORE_DUE_ATTRIBUTE, None)
    return True if more is None else bool(more)


def next_due_from_last_claim() -> tuple[bool, float | None]:
    """What this thread's last claim read of NEXT_DUE when it found nothing, less the time since on this process's
    own clock (a duration, never compared with the database's): (True, seconds or None if no run will come due),
    taken once; (False, None) if this thread's last claim took a run, or was not just now."""
    db = connections[conf.database()]
    reading = getattr(db, _NEXT_DUE_ATTRIBUTE, None)
    if reading is None:
        return False, None
    setattr(db, _NEXT_DUE_ATTRIBUTE, None)
    read_at, seconds = reading
    elapsed = time.monotonic() - read_at
    if elapsed > _NEXT_DUE_FRESH_SECONDS:
        return False, None
    return True, None if seconds is None else float(seconds) - elapsed


def admit(*, workflow: str, key: str, limit: int, run: str, clock: Clock = DATABASE) -> bool:
    """Whether `run` may take a slot of (workflow, key) under `limit`: durableruns_admit (migration 0019), which
    counts under the key's lock with a snapshot taken after it, as every claim's statement does (_CLAIMED_LIMITED).
    Called in the claiming transaction: the lock is held until it commits."""
    with connections[conf.database()].cursor() as cursor:
        shift: Any = clock.shift  # an interval: psycopg adapts it
        cursor.execute("SELECT durableruns_admit(%s, %s, %s, %s, %s)", [workflow, key, limit, run, shift])
        (admitted,) = cursor.fetchone()
    return bool(admitted)


# How many runs one claim may park before it gives up for now (each parked run is out of every probe after).
_PARKS_PER_CLAIM = 100


def limits_json() -> str | None:
    """This deploy's concurrency limits as the claim takes them (JSON: workflow -> limit), or None if it has none:
    then the claim is the statement without limits."""
    bounds = limits()
    return _limits_json_for(tuple(sorted(bounds.items()))) if bounds else None


@functools.lru_cache(maxsize=16)
def _limits_json_for(bounds: tuple[tuple[str, int], ...]) -> str:
    return json.dumps(dict(bounds))


def first_steps_json(first_steps: FirstSteps) -> str:
    return _first_steps_json_for(first_steps, conf.standby_intents() is not None)


@functools.lru_cache(maxsize=16)
def _first_steps_json_for(first_steps: FirstSteps, standby: bool) -> str:
    # A first step whose intent waits for a standby does not ride on the claim's commit (the claim's own
    # transaction keeps the server's level): its intent is recorded on its own, with the level it needs.
    return json.dumps([{"workflow": w, "fingerprint": f, "step": s} for w, f, s in first_steps
                       if not (standby and get_workflow(w)[s].waits_for_standby)])


def attempt_of(row: dict[str, Any]) -> StepAttempt:
    """An attempt as json_build_object returned it (timestamps as ISO text)."""
    for when in ("started_at", "finished_at"):
        if row[when] is not None:
            row[when] = datetime.fromisoformat(row[when])
    for when in ("renewed_at", "held_until", "raised_at"):
        row[when] = datetime.fromisoformat(row[when]) if row.get(when) else None
    row["progress"] = row["progress"] or {}
    return StepAttempt(**row)


def claim(*, owner: str, lease_seconds: float, clock: Clock = DATABASE, run_id: str | None = None,
          first_steps: FirstSteps = (), before_first_intent: Callable[[str], None] | None = None,
          hints: bool = False, queues: tuple[str, ...] = (), skip: Collection[str] = ()) -> Claimed | None:
    """Take the due run of highest priority, the one due first among equals (or `run_id`, if it is not held under a
    live lease); bump its epoch. With `queues`, only a run on one of those queues (a named `run_id` is taken
    whatever its queue). Runs in `skip` are left out: a single pass's runs it left due again at once
    (worker.pool), so it does not spin on them. A run of a workflow with a concurrency limit is taken only while
    its (workflow, key) has a slot free; on PostgreSQL one refused is parked (_CLAIMED_LIMITED)
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


def _claim(*, owner: str, lease_seconds: float, clock: Clock, run_id: str | None, first_steps: FirstSteps,
           before_first_intent: Callable[[str], None] | None, hints: bool = False,
           queues: tuple[str, ...] = (), skip: Collection[str] = ()) -> Claimed | None:
    """One claim, as `claim` describes it.

    On PostgreSQL, when it takes the next due run, a fresh run whose (workflow, plan fingerprint) is in
    `first_steps` also gets the intent of the named first step in the claim's commit (Claimed.first_intent), as
    each later step's intent rides on the result before it. `before_first_intent(step)` runs before that commit
    (fault injection). A claim of a named `run_id`, or on another database, records no intent.
    """
    if run_id is None and on_postgresql() and is_distributed(conf.database()):
        return _spread_claim(owner=owner, lease_seconds=lease_seconds, clock=clock, first_steps=first_steps,
                             hints=hints, queues=queues, skip=skip, before_first_intent=before_first_intent)
    if run_id is None and fast():
        times = {"shift": clock.shift, "lease": timedelta(seconds=lease_seconds)}
        bounds = limits_json()
        for _ in range(_PARKS_PER_CLAIM):
            try:
                taken = _pg_claim(owner=owner, times=times, first_steps=first_steps_json(first_steps),
                                    before_commit=before_first_intent, hints=hints, queues=queues, skip=skip,
                                    limits=bounds)
            except (DataError, IntegrityError):
                if not first_steps:
                    raise
                # The first intent rode on the claim and the database refused it: that run's data (a step name
                # longer than its column, recorded before a deploy that refuses such names). The statement took
                # nothing; claim again without it, so the engine records the intent on its own, where the pool
                # ends that run's turn only (worker.pool) instead of this claim stopping every pass at the same run.
                taken = _pg_claim(owner=owner, times=times, first_steps=first_steps_json(()),
                                    before_commit=before_first_intent, hints=hints, queues=queues, skip=skip,
                                    limits=bounds)
            # A run parked by its limit was not taken, and is out of every probe now: look again for the next.
            if taken is not None or parked_by_last_claim() is None:
                break
        if taken is None:
            return None
        (taken_id, epoch, workflow, fingerprint, payload, attempts, first_step, first_key, ending, trace, keys,
         overdue, takeovers) = taken
        first = None if first_step is None else Intent(step=first_step, attempt=1, effect_key=str(first_key),
                                                      cursor=0)
        return Claimed(lease=Lease(run_id=taken_id, owner=owner, epoch=epoch, seconds=lease_seconds),
                       workflow=workflow, plan_fingerprint=fingerprint, input=decoded(payload) or {},
                       attempts=[attempt_of(a) for a in decoded(attempts)], first_intent=first,
                       ending=ending or "", trace_context=decoded(trace), key_run_id=keys, overdue=overdue,
                       takeovers=takeovers)
    with transaction.atomic(using=conf.database(), durable=True):
        # Concurrency limits here: the limited runs whose key has no slot free are left out. SQLite has one writer
        # at a time (its transactions begin IMMEDIATE, durableruns.sqlite), so the count and the take are not
        # raced; nothing is parked (the limited runs are walked past instead: SQLite is the small, embedded case).
        if run_id is None:
            candidates = RunState.objects.claimable(clock.expression(), queues=queues).within_limits(
                limits(), clock.expression())
            if skip:
                candidates = candidates.exclude(pk__in=list(skip))
        else:
            candidates = RunState.objects.filter(pk=run_id).takeable(clock.expression())
            if not on_postgresql():  # PostgreSQL admits it under its key's lock, below
                candidates = candidates.within_limits(limits(), clock.expression())
            candidates = candidates.select_for_update(skip_locked=True)
        row = candidates.values("run_id", "epoch", "workflow", "plan_fingerprint", "input", "ending",
                                "trace_context", "status", "concurrency_key", "key_run_id", "deadline_at", "cursor",
                                "takeovers", "takeover_cursor").first()
        if row is None:
            return None
        if run_id is not None and on_postgresql() and not _admitted(row, clock):
            return None
        takeovers = takeovers_after(row)
        # Conditional on the epoch read: on a database without row locks (SQLite) this is what keeps two
        # workers from both taking the run.
        moved = RunState.objects.filter(pk=row["run_id"], epoch=row["epoch"]).update(
            status=RunStatus.RUNNING,
            owner=owner,
            epoch=F("epoch") + 1,
            lease_expires_at=clock.expression(timedelta(seconds=lease_seconds)),
            wake_at=None,
            updated_at=clock.expression(),
            debounce_key=None,  # begun: a debounced start with its key starts a new run from now on
            takeovers=takeovers,
            takeover_cursor=row["cursor"],
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
        key_run_id=row["key_run_id"],
        overdue=row["deadline_at"] is not None and row["deadline_at"] <= clock.now(),
        takeovers=takeovers,
    )


def takeovers_after(row: dict[str, Any]) -> int:
    """TAKEOVERS, for a claim that read the run's row (`status`, `cursor`, `takeovers`, `takeover_cursor`) first."""
    if row["status"] != RunStatus.RUNNING:
        return 0
    return (row["takeovers"] or 0) + 1 if row["takeover_cursor"] == row["cursor"] else 1


def _spread_claim(*, owner: str, lease_seconds: float, clock: Clock, first_steps: FirstSteps, hints: bool,
                  queues: tuple[str, ...], skip: Collection[str],
                  before_first_intent: Callable[[str], None] | None) -> Claimed | None:
    """The claim on a record distributed by Citus (store.spread), under this deploy's concurrency limits."""
    db = connections[conf.database()]
    lease = timedelta(seconds=lease_seconds)
    try:
        found = spread.claim(owner=owner, shift=clock.shift, lease=lease, first_steps=first_steps_json(first_steps),
                             queues=queues, skip=skip, hints=hints, limits=limits(),
                             before_commit=before_first_intent)
    except (DataError, IntegrityError):
        if not first_steps:
            raise
        # The database refused the first intent riding on the claim (as in _claim): nothing was taken; claim again
        # without it, so the engine records the intent on its own and only that run's turn ends.
        found = spread.claim(owner=owner, shift=clock.shift, lease=lease, first_steps=first_steps_json(()),
                             queues=queues, skip=skip, hints=hints, limits=limits(),
                             before_commit=before_first_intent)
    setattr(db, _PARKED_ATTRIBUTE, None)
    setattr(db, _NEXT_DUE_ATTRIBUTE, (time.monotonic(), found.next_due_seconds) if hints and not found.taken
            else None)
    setattr(db, _MORE_DUE_ATTRIBUTE, found.more_due if hints and found.taken else None)
    taken = found.taken
    if taken is None:
        return None
    first = None if taken.first_step is None else Intent(step=taken.first_step, attempt=1,
                                                         effect_key=str(taken.first_key), cursor=0)
    attempts = [StepAttempt(**{**a, "progress": decoded(a["progress"]) or {}, "result": decoded(a["result"])})
                for a in taken.attempts]
    return Claimed(lease=Lease(run_id=taken.run_id, owner=owner, epoch=taken.epoch, seconds=lease_seconds),
                   workflow=taken.workflow, plan_fingerprint=taken.plan_fingerprint,
                   input=decoded(taken.input) or {}, attempts=attempts, first_intent=first, ending=taken.ending,
                   trace_context=decoded(taken.trace_context), key_run_id=taken.key_run_id, overdue=taken.overdue,
                   takeovers=taken.takeovers)


def _admitted(row: dict[str, Any], clock: Clock) -> bool:
    """Whether a run named to a claim (resume_runs --run-id) may be taken under its concurrency limit: decided as
    every PostgreSQL claim decides it (durableruns_admit, under its (workflow, key)'s lock, counting with a
    snapshot taken after the lock), so two claims at once never both take the last slot. A running run keeps
    its slot; a run refused is left as it is, for a later claim."""
    bound = limits().get(row["workflow"])
    if bound is None or row["concurrency_key"] is None or row["status"] == RunStatus.RUNNING:
        return True
    if is_distributed(conf.database()):  # the cluster's admission, the same lock and a count across the shards
        with connections[conf.database()].cursor() as cursor:
            return spread.admitted(cursor, workflow=row["workflow"], key=row["concurrency_key"],
                                   status=row["status"], run=row["run_id"], shift=clock.shift, limits=limits())
    return admit(workflow=row["workflow"], key=row["concurrency_key"], limit=bound, run=row["run_id"], clock=clock)
