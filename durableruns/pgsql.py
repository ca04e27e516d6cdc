"""The hot path on PostgreSQL: each fact the engine records is ONE fenced statement, so one round trip and
one commit (autocommit makes a single statement its own transaction).

The fence is a data-modifying CTE on run_state conditioned on the worker's epoch (and, for a result, on the
attempt still being `started`); every other write in the statement reads from it, so a stale worker writes
nothing at all. PostgreSQL runs every data-modifying CTE to completion whether or not the outer query reads
it. store.py calls these only when the connection is PostgreSQL and falls back to the ORM otherwise.

The fenced statements, and the insert of a new run, are server-side prepared (DURABLERUNS_PREPARED_STATEMENTS, on
by default), so PostgreSQL parses them once per connection and, once it has seen that a generic plan does as well
as a custom one, stops planning them: planning was a third of a step's time in the database. A cached plan is only as good as the
table sizes it was made for (on a table of a few pages PostgreSQL scans sequentially, and keeps doing so as it
grows), so each connection prepares its statements anew every REPLAN_EVERY executions: a plan outlives at most
that many rows of growth. The claim is prepared too, and planned only under its own planner setting (below).
Django's own queries keep its client-side binding. A deployment behind a pooler that cannot keep
prepared statements turns preparing off; durableruns also turns it off by itself on any connection that reaches
PostgreSQL through something in between (a pooler such as PgBouncer in transaction mode runs a client's
consecutive transactions on different server connections, where a statement prepared on one does not exist):
one whose server port, inet_server_port(), is not the port it connected to.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

from durableruns import conf
from durableruns.limits import PARKED

log = logging.getLogger("durableruns")

if TYPE_CHECKING:
    import psycopg

# psycopg itself is imported only where a statement goes to PostgreSQL: a SQLite-only site installs durableruns
# without the [postgres] extra, and still imports this module (store.py does).

# Highest priority first, then the oldest, by walking run_state_ready_idx (priority DESC, created_at) in its order,
# and the waiting runs by run_state_wake_idx in wake order: the first unlocked due row ends each scan, however many
# runs are due. Left to its statistics, PostgreSQL may instead fetch every due run and sort
# them, at each claim, which makes draining a backlog quadratic: it does so whenever the statistics say almost
# nothing is due while thousands of runs are (after the tables were emptied and refilled, 10,000 runs drained
# 17% slower). SET LOCAL holds for the claim's own transaction only.
_CLAIM_PLANNING = "SET LOCAL enable_sort = off;\n"

# When the next run comes due by itself (a wake time, a lease running out), in seconds from the database's now; NULL
# if none will. An idle worker thread waits no longer than that (durableruns.worker.listener).
NEXT_DUE = """extract(epoch FROM least(
         (SELECT min(wake_at) FROM run_state WHERE status = 'waiting'),
         (SELECT min(lease_expires_at) FROM run_state WHERE status = 'running')) - now())"""

# A worker limited to some queues (resume_runs --queue) claims with the same statement plus this filter, as a
# statement of its own: the default claim keeps its plan, with no parameter that stands for "every queue".
_IN_QUEUES = "\n            AND queue = ANY(%(queues)s::text[])"

# The due run of two probes: the pending (or abandoned) run of highest priority, the oldest among equals, walking
# run_state_ready_idx, and the waiting run whose wake time came first, walking run_state_wake_idx: runs asleep (any
# number, holding nothing) are never walked past. Each probe locks at most one row, skipping locked ones. A woken
# run of the same priority comes first if it is the older.
_PROBES = """
         WITH ready AS MATERIALIZED (
           SELECT run_id, priority, created_at, status, workflow, concurrency_key FROM run_state
            WHERE status IN ('pending', 'running')
              AND (status = 'pending' OR lease_expires_at < now() + %(shift)s){queues}{skip}
            ORDER BY priority DESC, created_at LIMIT 1 FOR UPDATE SKIP LOCKED),
         woken AS MATERIALIZED (
           SELECT run_id, priority, created_at, status, workflow, concurrency_key FROM run_state
            WHERE status = 'waiting' AND wake_at <= now() + %(shift)s{queues}{skip}
            ORDER BY wake_at LIMIT 1 FOR UPDATE SKIP LOCKED)"""

# The first of the two in the claim's order, compared without a sort (a sort under the claim's enable_sort = off
# would cost the plan so much that PostgreSQL compiled it with JIT, seconds per claim).
_WOKEN_FIRST = ("coalesce(w.run_id IS NOT NULL AND (r.run_id IS NULL OR w.priority > r.priority"
                " OR (w.priority = r.priority AND w.created_at < r.created_at)), false)")

_TAKE = """UPDATE run_state SET status = 'running', owner = %(owner)s, epoch = epoch + 1,
         lease_expires_at = now() + %(shift)s + %(lease)s, wake_at = NULL, updated_at = now() + %(shift)s"""
_RETURNING = """RETURNING run_id, epoch, workflow, plan_fingerprint, input, cursor, ending, created_at, priority,
            trace_context"""

# Without concurrency limits in this deploy: take the chosen run.
_CLAIMED = """
WITH claimed AS (
  """ + _TAKE + """
   WHERE run_id = (""" + _PROBES + """
         SELECT CASE WHEN """ + _WOKEN_FIRST + """ THEN w.run_id ELSE r.run_id END
           FROM (VALUES (1)) AS one LEFT JOIN ready r ON true LEFT JOIN woken w ON true)
  """ + _RETURNING + """),
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
_CLAIMED_LIMITED = """
WITH chosen AS MATERIALIZED (""" + _PROBES + """
  SELECT CASE WHEN wf THEN w.run_id ELSE r.run_id END AS run_id,
         CASE WHEN wf THEN w.status ELSE r.status END AS status,
         CASE WHEN wf THEN w.workflow ELSE r.workflow END AS workflow,
         CASE WHEN wf THEN w.concurrency_key ELSE r.concurrency_key END AS concurrency_key
    FROM (VALUES (1)) AS one LEFT JOIN ready r ON true LEFT JOIN woken w ON true,
         LATERAL (SELECT """ + _WOKEN_FIRST + """ AS wf) AS pick),
verdict AS MATERIALIZED (
  SELECT c.run_id,
         CASE WHEN c.status = 'running' OR c.concurrency_key IS NULL OR %(limits)s::jsonb ->> c.workflow IS NULL
              THEN true
              ELSE durableruns_admit(c.workflow, c.concurrency_key, (%(limits)s::jsonb ->> c.workflow)::int,
                                     c.run_id) END AS admitted
    FROM chosen c WHERE c.run_id IS NOT NULL),
taken AS (
  UPDATE run_state SET status = CASE WHEN v.admitted THEN 'running' ELSE 'waiting' END,
         owner = CASE WHEN v.admitted THEN %(owner)s ELSE owner END,
         epoch = CASE WHEN v.admitted THEN epoch + 1 ELSE epoch END,
         lease_expires_at = CASE WHEN v.admitted THEN now() + %(shift)s + %(lease)s END, wake_at = NULL,
         reason = CASE WHEN v.admitted THEN run_state.reason ELSE '""" + PARKED + """' END,
         updated_at = now() + %(shift)s
    FROM verdict v WHERE run_state.run_id = v.run_id
  RETURNING run_state.run_id, epoch, workflow, plan_fingerprint, input, cursor, ending, created_at, priority,
            trace_context, v.admitted),
claimed AS (SELECT * FROM taken WHERE admitted),
parked AS (SELECT run_id FROM taken WHERE NOT admitted),"""

_CLAIM_TEMPLATE = """{claimed}
-- A fresh run (no attempt yet) of a workflow this deploy has, under the same plan: its first step's intent
-- rides on the claim's commit, as each later step's rides on the result before it.
first AS (
  INSERT INTO run_step (run_id, step, attempt, status, effect_key, started_at, held_until, finished_at, result,
                        error, resolution, owner, epoch, loop_cursor, progress)
  SELECT c.run_id, f.step, 1, 'started', c.run_id || ':' || f.step, now() + %(shift)s,
         now() + %(shift)s + %(lease)s, NULL, NULL, '', '', %(owner)s, c.epoch, 0, '{}'::jsonb
    FROM claimed c
    JOIN jsonb_to_recordset(%(first_steps)s::jsonb) AS f(workflow text, fingerprint text, step text)
      ON f.workflow = c.workflow AND f.fingerprint = c.plan_fingerprint
   WHERE c.cursor = 0 AND NOT EXISTS (SELECT 1 FROM run_step s WHERE s.run_id = c.run_id)
  RETURNING step, effect_key)
SELECT c.run_id, c.epoch, c.workflow, c.plan_fingerprint, c.input,
       -- the run's attempts ride on the claim (as they were before it): the boundary needs them first
       (SELECT coalesce(json_agg(json_build_object(
                 'step', s.step, 'attempt', s.attempt, 'status', s.status, 'effect_key', s.effect_key,
                 'started_at', s.started_at, 'finished_at', s.finished_at, 'renewed_at', s.renewed_at,
                 'held_until', s.held_until, 'raised_at', s.raised_at,
                 'loop_cursor', s.loop_cursor,
                 'progress', s.progress, 'result', s.result, 'error', s.error)), '[]'::json)
          FROM run_step s WHERE s.run_id = c.run_id),
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
       c.trace_context,
       -- the run parked by its concurrency limit instead (nothing claimed): the caller claims again
       (SELECT run_id FROM parked)
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
    queues = _IN_QUEUES if in_queues else ""
    text = _CLAIM_TEMPLATE.replace("{claimed}", _CLAIMED_LIMITED if limited else _CLAIMED)
    text = text.replace("{queues}", queues).replace("{other_queues}", queues.replace("AND q", "AND o.q"))
    text = text.replace("{skip}", _SKIPPING if skipping else "")
    return text.replace("%(hints)s", "true" if hints else "false")


_CLAIMS = {(in_queues, hints, skipping): _claim_text(in_queues=in_queues, hints=hints, skipping=skipping)
           for in_queues in (False, True) for hints in (False, True) for skipping in (False, True)}
# The same, in a deploy that declares concurrency limits.
_LIMITED_CLAIMS = {key: _claim_text(in_queues=key[0], hints=key[1], skipping=key[2], limited=True) for key in _CLAIMS}
_CLAIM = _CLAIMS[False, True, False]  # every queue, with hints: what a --loop worker sends

_INTENT_ROW = """
INSERT INTO run_step (run_id, step, attempt, status, effect_key, started_at, held_until, finished_at, result,
                      error, resolution, owner, epoch, loop_cursor, progress)
SELECT run_id, %(i_step)s, %(i_attempt)s, 'started', %(i_key)s, now() + %(shift)s, now() + %(shift)s + %(lease)s,
       NULL, NULL, '', '', %(owner)s, %(epoch)s, %(i_loop)s, %(i_progress)s::jsonb
  FROM fence
"""

# The channel on which whatever makes a run due wakes idle workers (durableruns.worker.listener); a notification
# is delivered when its transaction commits, never for a rollback.
WAKE_CHANNEL = "durableruns_due"
WAKE = f"SELECT pg_notify('{WAKE_CHANNEL}', '')"

# The insert wakes idle workers in the same statement. A deferred run (`wake`: not due before it) is waiting
# until then, and the claim takes it once the database's now reaches that time.
_CREATE_RUN = """
WITH created AS (
  INSERT INTO run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, lease_expires_at,
                         wake_at, reason, input, priority, queue, trace_context, concurrency_key, created_at,
                         updated_at)
  VALUES (%(run)s, %(workflow)s, %(fingerprint)s,
          CASE WHEN %(wake)s::timestamptz IS NULL THEN 'pending' ELSE 'waiting' END, 0, '', 0, NULL,
          %(wake)s::timestamptz, CASE WHEN %(wake)s::timestamptz IS NULL THEN '' ELSE %(deferred)s END,
          %(input)s::jsonb, %(priority)s, %(queue)s, %(trace)s::jsonb, %(limit_key)s::text, now(), now())
  RETURNING run_id)
SELECT pg_notify('""" + WAKE_CHANNEL + """', '') FROM created
"""

_RECORD_INTENT = """
WITH fence AS (
  UPDATE run_state SET cursor = %(cursor)s, updated_at = now() + %(shift)s,
         lease_expires_at = now() + %(shift)s + %(lease)s
   WHERE run_id = %(run)s AND epoch = %(epoch)s
  RETURNING run_id)
""" + _INTENT_ROW

_RESULT_HEAD = """
WITH fence AS (
  UPDATE run_state SET cursor = %(cursor)s, updated_at = now() + %(shift)s, {state}
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
_STILL_RUNNING = "lease_expires_at = now() + %(shift)s + %(lease)s"
_FINISHED = "status = 'completed', lease_expires_at = NULL, wake_at = NULL, reason = ''"
# A run's last result also wakes its parent's join (a child run's: durableruns.children), in the same commit, when
# its parent waits and no other child of it may still move as this statement sees them; a statement that saw one
# returns the parent's id, and store.record_result asks once more after the commit (store._wake_parent_after).
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

# A heartbeat: the lease runs on from the database's now, and the attempt in hand (started under this epoch)
# records that its process was alive then and the lease it now holds: a worker lost after this renewal may still
# have made its call at any moment until that lease ran out (policies.last_call_bound).
_RENEW = """
WITH fence AS (
  UPDATE run_state SET updated_at = now() + %(shift)s, lease_expires_at = now() + %(shift)s + %(lease)s
   WHERE run_id = %(run)s AND epoch = %(epoch)s AND status = 'running'
  RETURNING run_id),
seen AS (
  UPDATE run_step SET renewed_at = now() + %(shift)s, held_until = now() + %(shift)s + %(lease)s
   WHERE run_id = %(run)s AND epoch = %(epoch)s AND status = 'started' AND EXISTS (SELECT 1 FROM fence)
  RETURNING 1)
SELECT count(*) FROM fence
"""

# Every lease a process holds, in one statement: the held (run, epoch, lease seconds) as arrays; the runs renewed
# come back, and any other was released or taken over.
_RENEW_ALL = """
WITH held AS (
  SELECT * FROM unnest(%(runs)s::text[], %(epochs)s::bigint[], %(seconds)s::float8[]) AS h(run_id, epoch, seconds)),
fence AS (
  UPDATE run_state r SET updated_at = now() + %(shift)s,
         lease_expires_at = now() + %(shift)s + h.seconds * interval '1 second'
    FROM held h
   WHERE r.run_id = h.run_id AND r.epoch = h.epoch AND r.status = 'running'
  RETURNING r.run_id, r.epoch, r.lease_expires_at),
seen AS (
  UPDATE run_step s SET renewed_at = now() + %(shift)s, held_until = f.lease_expires_at
    FROM fence f
   WHERE s.run_id = f.run_id AND s.epoch = f.epoch AND s.status = 'started'
  RETURNING 1)
SELECT run_id FROM fence
"""


@functools.cache
def _prepared_cursor() -> type[psycopg.Cursor[Any]]:
    """The class of a server-side binding cursor whose every statement is prepared (parsed once per connection)."""
    import psycopg

    class PreparedCursor(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                    binary: bool | None = None) -> PreparedCursor:
            super().execute(query, params, prepare=True, binary=binary)
            return self

    return PreparedCursor


# Above any count a statement reaches, so psycopg prepares nothing on its own: only what asks (prepare=True).
_ONLY_WHEN_ASKED = 2**62
# Executions of the hot path on one connection after which its statements are prepared (and planned) anew.
REPLAN_EVERY = 1000


class _HotPath:
    """What the hot path keeps for one connection: a prepared cursor, reused for every statement (a step
    makes one), how many statements it ran, and their texts for the current plan generation."""

    def __init__(self, db: Any) -> None:
        self.raw = db.connection
        self.prepares = not through_a_proxy(self.raw)
        if not self.prepares:
            # Nothing prepared on this connection, not even by psycopg on its own (a site's prepare_threshold):
            # the next transaction may run on another server connection.
            self.raw.prepare_threshold = None
            return
        if self.raw.prepare_threshold is None:  # Django turns preparing off for the whole connection by default
            self.raw.prepare_threshold = _ONLY_WHEN_ASKED
        self.cursor = CursorWrapper(_prepared_cursor()(self.raw), db)  # wrapped like Django's own cursors
        self.executions = 0
        self._generation = 0
        self._texts: dict[str, str] = {}

    def text(self, sql: str) -> str:
        """`sql` as this connection prepares it now, tagged with its plan generation: a new tag is a new
        statement to psycopg, which prepares it and, past its cache size (prepared_max), deallocates the oldest."""
        generation = self.executions // REPLAN_EVERY
        self.executions += 1
        if generation != self._generation:
            self._generation, self._texts = generation, {}
        text = self._texts.get(sql)
        if text is None:
            text = self._texts[sql] = f"{sql}\n-- plan generation {generation}"
        return text


_ATTRIBUTE = "durableruns_hot_path"  # on Django's connection wrapper, which is per thread like the connection


def _hot_path() -> _HotPath | None:
    """This thread's connection's hot path, or None where Django logs queries (DEBUG, CaptureQueriesContext)
    or preparing is off: there the statements go through Django's own cursor with their values, like every
    other query."""
    db = connections[conf.database()]
    if db.queries_logged or not conf.prepared_statements():
        return None
    db.ensure_connection()
    hot: _HotPath | None = getattr(db, _ATTRIBUTE, None)
    if hot is None or hot.raw is not db.connection:  # first use, or Django has connected again since
        hot = _HotPath(db)
        setattr(db, _ATTRIBUTE, hot)
    return hot if hot.prepares else None


_proxied_said = False


def through_a_proxy(raw: psycopg.Connection[Any]) -> bool:
    """Whether `raw` reaches PostgreSQL through a proxy or pooler: the server listens on another port than the
    one this connection was made to (a Unix socket straight to the server reports none, and is direct)."""
    global _proxied_said
    (server_port,) = raw.execute("SELECT inet_server_port()").fetchone() or (None,)
    try:
        client_port = int(raw.info.port)
    except (TypeError, ValueError):
        return False
    proxied = server_port is not None and int(server_port) != client_port
    if proxied and not _proxied_said:
        _proxied_said = True
        log.info("connected on port %s to PostgreSQL listening on port %s: through a pooler or proxy, so "
                 "nothing is prepared on the server (DURABLERUNS_PREPARED_STATEMENTS)", client_port, server_port)
    return proxied


def _one(sql: str, params: dict[str, Any]) -> Any:
    hot = _hot_path()
    if hot is None:
        with connections[conf.database()].cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()
    hot.cursor.execute(hot.text(sql), params)
    return hot.cursor.fetchone()


def _rowcount(sql: str, params: dict[str, Any]) -> int:
    hot = _hot_path()
    if hot is None:
        with connections[conf.database()].cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.rowcount)
    hot.cursor.execute(hot.text(sql), params)
    return int(hot.cursor.rowcount)


Claim = tuple[str, int, str, str, Any, Any, "str | None", "str | None", str, Any]
# Every time in these statements is the database's now() moved by `shift` (zero outside tests), and a lease runs
# `lease` from it: no host's clock decides who owns a run (durableruns.clock).
Times = dict[str, timedelta]


def claim(*, owner: str, times: Times, first_steps: str,
          before_commit: Callable[[str], None] | None = None, hints: bool = False,
          queues: tuple[str, ...] = (), skip: Collection[str] = (), limits: str | None = None) -> Claim | None:
    """Take the due run of highest priority (the oldest among equals) in one statement, with its attempts; SKIP
    LOCKED lets any number of workers scan at once. With `queues`, only a run on one of them; `skip`, runs this
    pass leaves out (store.claim). A fresh run of a workflow in `first_steps` (JSON: workflow, fingerprint, step)
    gets its first
    step's intent in the same commit; the row ends with that step and its effect key, or two NULLs.

    The statement always runs in a transaction of its own with _CLAIM_PLANNING, so every plan PostgreSQL makes
    for it (custom, generic, or again after an ANALYZE) walks the index. `before_commit(step)` (fault injection)
    is called with the transaction still open when a first intent rode on the claim: nothing is recorded yet.

    With `hints` (a worker whose idle threads wait on a waker) the row also says when the next run comes due by
    itself (nothing claimed) or whether another was due behind the one taken (next_due_from_last_claim,
    more_due_after_last_claim); without, neither subquery runs, and a --once pass pays nothing for them.

    With `limits` (JSON: each limited workflow of this deploy -> its limit) the chosen run is admitted under its
    limit or parked instead (_CLAIMED_LIMITED): then nothing is claimed, and parked_by_last_claim() names it."""
    import psycopg

    params: dict[str, Any] = {"owner": owner, "first_steps": first_steps, "hints": hints, **times}
    statement = (_LIMITED_CLAIMS if limits else _CLAIMS)[bool(queues), hints, bool(skip)]
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
    hot = _hot_path()
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
                    cursor.execute("".join(opening) + _CLAIM_PLANNING + statement, params)
                    for _ in range(len(opening) + 1):  # past the empty results of BEGIN and SET, to the claim's
                        cursor.nextset()
                    row = cursor.fetchone()
            else:
                # Prepared, in a pipeline: BEGIN, the setting, the claim (and COMMIT) go in one round trip.
                with raw.pipeline():
                    raw.execute("BEGIN")
                    raw.execute(_CLAIM_PLANNING)
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
        setattr(db, _PARKED_ATTRIBUTE, row[12])
        if hints:
            setattr(db, _NEXT_DUE_ATTRIBUTE, (time.monotonic(), row[9]))
        return None
    if hints:
        setattr(db, _MORE_DUE_ATTRIBUTE, bool(row[10]))
    return (row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8] or "", row[11])


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


def wake_workers() -> None:
    """Notify idle workers from the current transaction (on its commit) or, in autocommit, at once."""
    with connections[conf.database()].cursor() as cursor:
        cursor.execute(WAKE)


def create_run(*, run: str, workflow: str, fingerprint: str, input: str, trace: str | None = None, priority: int = 0,
               queue: str = "default", wake_at: datetime | None = None, deferred: str = "",
               concurrency_key: str | None = None) -> None:
    """Record a pending run (`input`, and `trace`, its trace context or None, as JSON text) created at the
    database's now, or a waiting one until `wake_at` (with `deferred` as its reason): the row
    RunState.objects.create writes, without building it through the ORM. A duplicate run_id raises Django's
    IntegrityError."""
    _rowcount(_CREATE_RUN, {"run": run, "workflow": workflow, "fingerprint": fingerprint, "input": input,
                            "trace": trace, "priority": priority, "queue": queue, "wake": wake_at,
                            "deferred": deferred, "limit_key": concurrency_key})


def record_intent(*, run: str, epoch: int, owner: str, times: Times, cursor: int, standby: str | None = None,
                  **intent: Any) -> bool:
    """Insert the started row (`intent`: i_step, i_attempt, i_key, i_loop, i_progress) and move the cursor,
    fenced; False if the epoch is stale. With `standby` (a synchronous_commit level) its commit waits for the
    standby (_waiting_for_standby)."""
    params = {"run": run, "epoch": epoch, "owner": owner, "cursor": cursor, **times, **intent}
    if standby is not None:
        return _waiting_for_standby(_RECORD_INTENT, params, standby)[1] == 1
    return _rowcount(_RECORD_INTENT, params) == 1


def record_result(*, run: str, epoch: int, owner: str, times: Times, cursor: int, step: str, attempt: int,
                  result: str, resolution: str, finish: bool, intent: dict[str, Any] | None,
                  standby: str | None = None) -> bool | str:
    """Complete the started attempt, move the cursor, and either add the next intent or finish the run; with
    `standby`, the commit (the next intent's) waits for the standby. False if fenced out. A child run's last
    result: its parent's id if the parent is to be asked about once more after the commit (_WAKE_PARENT)."""
    params = {"run": run, "epoch": epoch, "owner": owner, "cursor": cursor, "step": step, "attempt": attempt,
              "result": result, "resolution": resolution, **times}
    if intent is not None:
        params.update(intent)
    sql = _RECORD_RESULT[(intent is not None, finish)]
    if standby is not None:
        return _waiting_for_standby(sql, params, standby)[0] is not None
    row = _one(sql, params)
    if row is None:
        return False
    if finish and row[0] is not None and not row[1]:  # a child that saw a sibling still moving
        return str(row[0])
    return True


def _waiting_for_standby(sql: str, params: dict[str, Any], level: str) -> tuple[Any, int]:
    """Run one fenced statement in a transaction of its own whose commit waits at synchronous_commit `level`
    (SET LOCAL: this transaction only; PostgreSQL reads it when it commits); return its first row and rowcount.

    Prepared, the four go in one round trip (a pipeline), as the claim's do; unprepared, BEGIN, the setting and
    the statement go as one query string and COMMIT after it."""
    if level not in conf.STANDBY_LEVELS:  # spelled into the SQL: only the levels conf allows
        raise ValueError(f"not a synchronous_commit level that waits for a standby: {level!r}")
    import psycopg  # here: see the module's imports
    setting = f"SET LOCAL synchronous_commit = {level}"
    db = connections[conf.database()]
    hot = _hot_path()
    db.ensure_connection()
    raw = db.connection
    with db.wrap_database_errors:
        try:
            if hot is None:
                wrapper = CursorDebugWrapper if db.queries_logged else CursorWrapper
                with wrapper(psycopg.ClientCursor(raw), db) as cursor:
                    cursor.execute(f"BEGIN;\n{setting};\n{sql}", params)
                    cursor.nextset()  # past the empty results of BEGIN and SET, to the statement's
                    cursor.nextset()
                    row = cursor.fetchone() if cursor.description else None
                    count = int(cursor.rowcount)
                raw.execute("COMMIT")
            else:
                with raw.pipeline():
                    raw.execute("BEGIN")
                    raw.execute(setting)
                    hot.cursor.execute(hot.text(sql), params)
                    raw.execute("COMMIT")
                row = hot.cursor.fetchone() if hot.cursor.description else None
                count = int(hot.cursor.rowcount)
        except BaseException:
            if not raw.closed and raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                raw.execute("ROLLBACK")
            raise
    return row, count


def checkpoint(*, run: str, epoch: int, times: Times, step: str, attempt: int, loop: int, progress: str) -> bool:
    """Commit a loop's position inside the started attempt, fenced."""
    return _rowcount(_CHECKPOINT, {"run": run, "epoch": epoch, "step": step, "attempt": attempt, "loop": loop,
                                   "progress": progress, **times}) == 1


def renew_all(*, runs: list[str], epochs: list[int], seconds: list[float], shift: timedelta) -> set[str]:
    """Extend the leases of many running runs at once from the database's now; return the runs renewed."""
    hot = _hot_path()
    params: dict[str, Any] = {"runs": runs, "epochs": epochs, "seconds": seconds, "shift": shift}
    if hot is None:
        with connections[conf.database()].cursor() as cursor:
            cursor.execute(_RENEW_ALL, params)
            return {run for (run,) in cursor.fetchall()}
    hot.cursor.execute(hot.text(_RENEW_ALL), params)
    return {run for (run,) in hot.cursor.fetchall()}


def renew(*, run: str, epoch: int, times: Times) -> bool:
    """Extend a running run's lease from the database's now and mark its attempt in hand alive; False if the
    epoch is stale or the run is no longer running."""
    return int(_one(_RENEW, {"run": run, "epoch": epoch, **times})[0]) == 1


def complete_wait(*, run: str, epoch: int, owner: str, times: Times, cursor: int, step: str, attempt: int,
                  begun: bool, key: str, result: str, resolution: str, event_id: int | None) -> bool:
    """Complete the wait `step` (its started attempt if `begun`, else a completed attempt inserted), move the
    cursor past it and consume the event `event_id` (None: none), in one statement; False if fenced out (a stale
    epoch, the attempt no longer as expected, or the event consumed already), when nothing is recorded."""
    row = _one(_COMPLETE_WAIT[begun], {"run": run, "epoch": epoch, "owner": owner, "cursor": cursor, "step": step,
                                       "attempt": attempt, "key": key, "result": result, "resolution": resolution,
                                       "event_id": event_id, **times})
    return bool(row[0] == 1 and row[1] == 1 and row[2] == (0 if event_id is None else 1))


def record_event(*, run: str, event: str, key: str | None, payload: str, shift: timedelta) -> bool:
    """Insert an event (`payload` as JSON text) into the caller's transaction, which holds the run's row, and make
    the run due if it waits for one of that name; False (nothing written) if the run has an event with `key`."""
    row = _one(_RECORD_EVENT, {"run": run, "event": event, "key": key, "payload": payload, "shift": shift})
    return bool(row[0])


def now_and_oldest_event(*, run: str, event: str, shift: timedelta) -> tuple[datetime, tuple[int, Any] | None]:
    """The database's now (moved by `shift`) and the oldest event of that name the run has not consumed, as
    (id, payload) or None: one round trip."""
    now, event_id, payload = _one(_NOW_AND_OLDEST_EVENT, {"run": run, "event": event, "shift": shift})
    return now, None if event_id is None else (event_id, payload)


def admit(*, workflow: str, key: str, limit: int, run: str) -> bool:
    """Whether `run` may take a slot of (workflow, key) under `limit`: durableruns_admit (migration 0019), which
    counts under the key's lock with a snapshot taken after it, as every claim's statement does (_CLAIMED_LIMITED).
    Called in the claiming transaction: the lock is held until it commits."""
    with connections[conf.database()].cursor() as cursor:
        cursor.execute("SELECT durableruns_admit(%s, %s, %s, %s)", [workflow, key, limit, run])
        (admitted,) = cursor.fetchone()
    return bool(admitted)
