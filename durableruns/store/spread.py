"""The claim on a record distributed by Citus (durableruns.distribution, docs/citus.md): every worker finds work
whichever node holds it, and every lock and write names one run_id, so it runs on one shard and commits there.

Citus runs `SELECT ... FOR UPDATE SKIP LOCKED` only in a query routed to one shard, so the single-node claim (one
statement that picks and locks the first due run of the whole table) cannot run on it. Here a claim is:

1. a read without locks, across every shard in parallel: the first CANDIDATES due runs in the claim's order
   (higher priority first, then the one due first: a ready run at its creation, a woken one at its wake time);
2. for each in that order, one transaction on the run's shard: lock it if it is still due and nobody holds it
   (`... WHERE run_id = %s AND <due> FOR UPDATE SKIP LOCKED`), take it (epoch + 1, a lease), read its attempts, and
   record its first step's intent if it is fresh, as the single-node claim does. The first one taken ends the
   claim; one taken by another worker meanwhile is skipped, as SKIP LOCKED skips it on one node.

One clock per decision: each transaction first reads the coordinator's now() (a statement on no distributed table
runs there), and every time compared or written in it is that value (Citus evaluates now() in an UPDATE or INSERT
on the coordinator as well, before routing it). Oldest-first holds across the cluster up to the candidates read,
which a concurrent claimer may take first: then the next is tried.

Concurrency limits (`Workflow(concurrency=, concurrency_key=)`): a run of a limited workflow that does not hold a
slot yet (not running) is taken only while its (workflow, key) has fewer runs holding a slot than the limit: the
running ones, and those someone else ended while their worker may still be inside a call (a live lease kept), as
on one node. The slots of a key may be held on every node, so the count is a read across the shards; two claims
must not both count 2 of 3 and take the last slot, so the admission first takes the key's transaction-scoped
advisory lock on the coordinator (the lock the single node's durableruns_admit takes), then counts in a statement
of its own (a snapshot taken after the lock, which sees every claim of the key committed before it), then takes
the run; the lock is let go when the take commits. The take's commit stays on the run's node alone: the other
nodes were only read. Nothing is parked here (parking and letting go are triggers that would reach other shards):
the candidate read leaves out the limited runs whose key is full, read in the same pass, so a held-back run is
walked past, costs no lock, and is taken by the first claim after a slot frees (the worker whose run freed it
claims again at once; an idle one when the run it was timed for comes due, or at its poll).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction

from durableruns import conf
from durableruns.store.base import TAKEOVERS

# How many due runs one read names; taken in order until one is free.
CANDIDATES = 8

_DUE = """((status IN ('pending', 'running') AND (status = 'pending' OR lease_expires_at < %(now)s))
          OR (status = 'waiting' AND wake_at <= %(now)s))"""

_CANDIDATES = """SELECT run_id FROM run_state
 WHERE """ + _DUE + """{queues}{skip}{full}
 ORDER BY priority DESC, CASE WHEN status = 'waiting' THEN wake_at ELSE created_at END, created_at
 LIMIT %(limit)s"""

_LOCK = """SELECT workflow, concurrency_key, status FROM run_state
 WHERE run_id = %(run)s AND """ + _DUE + "{queues} FOR UPDATE SKIP LOCKED"

# The runs holding a slot of a limited (workflow, key): running, or ended by someone else with the lease they had
# still live (each arm read through its partial index: run_state_limit_running_idx, run_state_limit_held_idx).
_HOLDING = """SELECT workflow, concurrency_key, run_id FROM run_state
  WHERE status = 'running' AND concurrency_key IS NOT NULL AND workflow = ANY(%(limited)s::text[])
 UNION ALL
 SELECT workflow, concurrency_key, run_id FROM run_state
  WHERE status <> 'running' AND concurrency_key IS NOT NULL AND lease_expires_at IS NOT NULL
    AND lease_expires_at > %(now)s AND workflow = ANY(%(limited)s::text[])"""

# The keys of this deploy's limits whose slots are all held: their runs not yet holding one are not candidates.
_FULL_KEYS = """SELECT workflow || E'\\n' || concurrency_key FROM (""" + _HOLDING + """) AS holding
 GROUP BY workflow, concurrency_key HAVING count(*) >= (%(limits)s::jsonb ->> workflow)::int"""

_NOT_FULL = """
   AND NOT (concurrency_key IS NOT NULL AND status <> 'running'
            AND workflow || E'\\n' || concurrency_key = ANY(%(full)s::text[]))"""

_ADMIT_LOCK = ("SELECT pg_advisory_xact_lock(hashtext('durableruns.concurrency'), "
               "hashtext(%(workflow)s || E'\\n' || %(key)s))")

# How many others hold a slot of the run's key (the run itself may keep a lease it had: not counted against it).
_HOLDERS = """SELECT count(*) FROM (""" + _HOLDING + """) AS holding
 WHERE workflow = %(workflow)s AND concurrency_key = %(key)s AND run_id <> %(run)s"""

_TAKE = """UPDATE run_state SET status = 'running', owner = %(owner)s, epoch = epoch + 1,
       lease_expires_at = %(now)s::timestamptz + %(lease)s, wake_at = NULL, updated_at = %(now)s, debounce_key = NULL,
       """ + TAKEOVERS + """
 WHERE run_id = %(run)s
 RETURNING run_id, epoch, workflow, plan_fingerprint, input, cursor, ending, key_run_id, trace_context, deadline_at,
           takeovers"""

_ATTEMPTS = """SELECT step, attempt, status, effect_key, started_at, finished_at, renewed_at, held_until, raised_at,
       loop_cursor, progress, result, error FROM run_step WHERE run_id = %(run)s"""

_FIRST_INTENT = """INSERT INTO run_step (run_id, step, attempt, status, effect_key, started_at, held_until,
                      finished_at, result, error, resolution, owner, epoch, loop_cursor, progress)
VALUES (%(run)s, %(step)s, 1, 'started', %(key)s, %(now)s, %(now)s::timestamptz + %(lease)s, NULL, NULL, '', '',
        %(owner)s, %(epoch)s, 0, '{}'::jsonb)"""

# When the next run comes due by itself: a wake time, a lease running out, or a slot someone else's cancel left
# held until the lease it had runs out (a run of its key held back until then).
_NEXT_DUE = """SELECT (SELECT min(wake_at) FROM run_state WHERE status = 'waiting'),
       (SELECT min(lease_expires_at) FROM run_state WHERE status = 'running'),
       (SELECT min(lease_expires_at) FROM run_state
         WHERE status <> 'running' AND concurrency_key IS NOT NULL AND lease_expires_at IS NOT NULL
           AND lease_expires_at > %(now)s)"""


@dataclass(frozen=True)
class Taken:
    """A run taken: its row as the claim returned it, its attempts, and the first intent recorded with it."""

    run_id: str
    epoch: int
    workflow: str
    plan_fingerprint: str
    input: Any
    attempts: list[dict[str, Any]]
    first_step: str | None
    first_key: str | None
    ending: str
    trace_context: Any
    key_run_id: str | None
    overdue: bool
    takeovers: int = 0  # the claims in a row that took it over from a dead worker (store.claims.TAKEOVERS)


@dataclass(frozen=True)
class Pass:
    """What one claim found: the run taken (or None), whether more were due behind it, and (nothing taken) in how
    many seconds of the database's clock the next run comes due by itself (None: none will)."""

    taken: Taken | None
    more_due: bool
    next_due_seconds: float | None


_SHARDS = "SELECT get_shard_id_for_distribution_column('run_state', r), r FROM unnest(%s::text[]) AS r"

_LOCK_IN_SHARD = """SELECT run_id FROM run_state WHERE run_id = ANY(%s::text[]) AND status = ANY(%s::text[])
   FOR UPDATE SKIP LOCKED"""


def lock_runs(run_ids: list[str], statuses: Collection[str]) -> set[str]:
    """Inside the caller's transaction: lock those of `run_ids` still in one of `statuses` that no other
    transaction holds, skipping the others, as one node's `FOR UPDATE SKIP LOCKED` does; return their ids. Citus
    runs that only in a statement routed to one shard: one statement per shard the runs are on."""
    using = conf.database()
    with connections[using].cursor() as cursor:
        cursor.execute(_SHARDS, [run_ids])
        by_shard: dict[int, list[str]] = {}
        for shard, run_id in cursor.fetchall():
            by_shard.setdefault(shard, []).append(run_id)
        held: set[str] = set()
        for ids in by_shard.values():
            cursor.execute(_LOCK_IN_SHARD, [ids, list(statuses)])
            held.update(row[0] for row in cursor.fetchall())
    return held


def _now(cursor: Any, shift: timedelta) -> datetime:
    cursor.execute("SELECT now() + %s", [shift])
    (now,) = cursor.fetchone()
    return now  # type: ignore[no-any-return]


def claim(*, owner: str, shift: timedelta, lease: timedelta, first_steps: str, queues: tuple[str, ...] = (),
          skip: Collection[str] = (), hints: bool = False, limits: Mapping[str, int] | None = None,
          before_commit: Callable[[str], None] | None = None) -> Pass:
    """Take the first due run in the claim's order that no other worker holds, under this deploy's concurrency
    `limits` (workflow -> limit) (the module's docstring). `before_commit(step)` (fault injection) is called with
    the transaction still open when a first intent rode on the claim, as the single-node claim calls it."""
    using = conf.database()
    queue_filter = "\n   AND queue = ANY(%(queues)s::text[])" if queues else ""
    skip_filter = "\n   AND run_id <> ALL(%(skip)s::text[])" if skip else ""
    params: dict[str, Any] = {"owner": owner, "lease": lease, "limit": CANDIDATES, "queues": list(queues),
                              "skip": sorted(skip), "limits": json.dumps(dict(limits or {})),
                              "limited": sorted(limits or {})}
    full_filter = ""
    with connections[using].cursor() as cursor:
        params["now"] = _now(cursor, shift)
        if limits:
            cursor.execute(_FULL_KEYS, params)
            params["full"] = [row[0] for row in cursor.fetchall()]
            full_filter = _NOT_FULL if params["full"] else ""
        cursor.execute(_CANDIDATES.format(queues=queue_filter, skip=skip_filter, full=full_filter), params)
        candidates = [row[0] for row in cursor.fetchall()]
    firsts = {(f["workflow"], f["fingerprint"]): f["step"] for f in json.loads(first_steps)}
    for index, run_id in enumerate(candidates):
        taken = _take(using, run_id, params | {"run": run_id}, shift, queue_filter, firsts, limits or {},
                      before_commit)
        if taken is not None:
            return Pass(taken=taken, more_due=index + 1 < len(candidates), next_due_seconds=None)
    next_due = None
    if hints and not candidates:
        with connections[using].cursor() as cursor:
            now = _now(cursor, shift)
            cursor.execute(_NEXT_DUE, {"now": now})
            times = [t for t in cursor.fetchone() if t is not None]
        next_due = (min(times) - now).total_seconds() if times else None
    return Pass(taken=None, more_due=bool(candidates), next_due_seconds=next_due)


def admitted(cursor: Any, *, workflow: str, key: str | None, status: str, run: str, shift: timedelta,
             limits: Mapping[str, int]) -> bool:
    """Whether `run` may take a slot of its (workflow, key), inside the transaction that takes it (the module's
    docstring): a run not limited, or already running (its worker died: it keeps its slot), always may. The
    leases are judged by the coordinator's clock read after the key's lock."""
    bound = limits.get(workflow)
    if bound is None or key is None or status == "running":
        return True
    params: dict[str, Any] = {"workflow": workflow, "key": key, "run": run, "limited": [workflow]}
    cursor.execute(_ADMIT_LOCK, params)
    params["now"] = _now(cursor, shift)
    cursor.execute(_HOLDERS, params)
    (holding,) = cursor.fetchone()
    return int(holding) < bound


def _take(using: str, run_id: str, params: dict[str, Any], shift: timedelta, queue_filter: str,
          firsts: dict[tuple[str, str], str], limits: Mapping[str, int],
          before_commit: Callable[[str], None] | None) -> Taken | None:
    """Lock, admit under its limit, take and read one run, and record its first intent if fresh: one transaction
    written on its shard alone."""
    with transaction.atomic(using=using, durable=True), connections[using].cursor() as cursor:
        params = params | {"now": _now(cursor, shift)}
        cursor.execute(_LOCK.format(queues=queue_filter), params)
        locked = cursor.fetchone()
        if locked is None:
            return None  # another worker holds it, or took it since the read
        workflow, key, status = locked
        if not admitted(cursor, workflow=workflow, key=key, status=status, run=run_id, shift=shift, limits=limits):
            return None  # its key's slots filled since the read: walked past, nothing written
        cursor.execute(_TAKE, params)
        (run, epoch, workflow, fingerprint, payload, cursor_at, ending, key_run_id, trace,
         deadline_at, takeovers) = cursor.fetchone()
        cursor.execute(_ATTEMPTS, params)
        names = [column.name for column in cursor.description]
        attempts = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        step = firsts.get((workflow, fingerprint)) if cursor_at == 0 and not attempts else None
        key = None
        if step is not None:
            key = f"{key_run_id or run}:{step}"
            cursor.execute(_FIRST_INTENT, params | {"step": step, "key": key, "epoch": epoch})
            if before_commit is not None:
                before_commit(step)
        return Taken(run_id=run, epoch=epoch, workflow=workflow, plan_fingerprint=fingerprint, input=payload,
                     attempts=attempts, first_step=step, first_key=key, ending=ending or "",
                     trace_context=trace, key_run_id=key_run_id,
                     overdue=deadline_at is not None and deadline_at <= params["now"], takeovers=takeovers or 0)
