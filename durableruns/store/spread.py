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
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction

from durableruns import conf

# How many due runs one read names; taken in order until one is free.
CANDIDATES = 8

_DUE = """((status IN ('pending', 'running') AND (status = 'pending' OR lease_expires_at < %(now)s))
          OR (status = 'waiting' AND wake_at <= %(now)s))"""

_CANDIDATES = """SELECT run_id FROM run_state
 WHERE """ + _DUE + """{queues}{skip}
 ORDER BY priority DESC, CASE WHEN status = 'waiting' THEN wake_at ELSE created_at END, created_at
 LIMIT %(limit)s"""

_LOCK = "SELECT run_id FROM run_state WHERE run_id = %(run)s AND " + _DUE + "{queues} FOR UPDATE SKIP LOCKED"

_TAKE = """UPDATE run_state SET status = 'running', owner = %(owner)s, epoch = epoch + 1,
       lease_expires_at = %(now)s::timestamptz + %(lease)s, wake_at = NULL, updated_at = %(now)s, debounce_key = NULL
 WHERE run_id = %(run)s
 RETURNING run_id, epoch, workflow, plan_fingerprint, input, cursor, ending, key_run_id, trace_context, deadline_at"""

_ATTEMPTS = """SELECT step, attempt, status, effect_key, started_at, finished_at, renewed_at, held_until, raised_at,
       loop_cursor, progress, result, error FROM run_step WHERE run_id = %(run)s"""

_FIRST_INTENT = """INSERT INTO run_step (run_id, step, attempt, status, effect_key, started_at, held_until,
                      finished_at, result, error, resolution, owner, epoch, loop_cursor, progress)
VALUES (%(run)s, %(step)s, 1, 'started', %(key)s, %(now)s, %(now)s::timestamptz + %(lease)s, NULL, NULL, '', '',
        %(owner)s, %(epoch)s, 0, '{}'::jsonb)"""

_NEXT_DUE = """SELECT (SELECT min(wake_at) FROM run_state WHERE status = 'waiting'),
       (SELECT min(lease_expires_at) FROM run_state WHERE status = 'running')"""


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


@dataclass(frozen=True)
class Pass:
    """What one claim found: the run taken (or None), whether more were due behind it, and (nothing taken) in how
    many seconds of the database's clock the next run comes due by itself (None: none will)."""

    taken: Taken | None
    more_due: bool
    next_due_seconds: float | None


def _now(cursor: Any, shift: timedelta) -> datetime:
    cursor.execute("SELECT now() + %s", [shift])
    (now,) = cursor.fetchone()
    return now  # type: ignore[no-any-return]


def claim(*, owner: str, shift: timedelta, lease: timedelta, first_steps: str, queues: tuple[str, ...] = (),
          skip: Collection[str] = (), hints: bool = False,
          before_commit: Callable[[str], None] | None = None) -> Pass:
    """Take the first due run in the claim's order that no other worker holds (the module's docstring).
    `before_commit(step)` (fault injection) is called with the transaction still open when a first intent rode
    on the claim, as the single-node claim calls it."""
    using = conf.database()
    queue_filter = "\n   AND queue = ANY(%(queues)s::text[])" if queues else ""
    skip_filter = "\n   AND run_id <> ALL(%(skip)s::text[])" if skip else ""
    params: dict[str, Any] = {"owner": owner, "lease": lease, "limit": CANDIDATES, "queues": list(queues),
                              "skip": sorted(skip)}
    with connections[using].cursor() as cursor:
        params["now"] = _now(cursor, shift)
        cursor.execute(_CANDIDATES.format(queues=queue_filter, skip=skip_filter), params)
        candidates = [row[0] for row in cursor.fetchall()]
    firsts = {(f["workflow"], f["fingerprint"]): f["step"] for f in json.loads(first_steps)}
    for index, run_id in enumerate(candidates):
        taken = _take(using, run_id, params | {"run": run_id}, shift, queue_filter, firsts, before_commit)
        if taken is not None:
            return Pass(taken=taken, more_due=index + 1 < len(candidates), next_due_seconds=None)
    next_due = None
    if hints and not candidates:
        with connections[using].cursor() as cursor:
            now = _now(cursor, shift)
            cursor.execute(_NEXT_DUE)
            times = [t for t in cursor.fetchone() if t is not None]
        next_due = (min(times) - now).total_seconds() if times else None
    return Pass(taken=None, more_due=bool(candidates), next_due_seconds=next_due)


def _take(using: str, run_id: str, params: dict[str, Any], shift: timedelta, queue_filter: str,
          firsts: dict[tuple[str, str], str], before_commit: Callable[[str], None] | None) -> Taken | None:
    """Lock, take and read one run, and record its first intent if fresh: one transaction on its shard."""
    with transaction.atomic(using=using, durable=True), connections[using].cursor() as cursor:
        params = params | {"now": _now(cursor, shift)}
        cursor.execute(_LOCK.format(queues=queue_filter), params)
        if cursor.fetchone() is None:
            return None  # another worker holds it, or took it since the read
        cursor.execute(_TAKE, params)
        (run, epoch, workflow, fingerprint, payload, cursor_at, ending, key_run_id, trace,
         deadline_at) = cursor.fetchone()
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
                     overdue=deadline_at is not None and deadline_at <= params["now"])
