"""The writes outside a run's drive (durableruns.ops, the worker): alert marks, a worker's presence, measuring's
scratch runs, and the deletion of runs past retention."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, transaction

from durableruns import conf
from durableruns.clock import Clock
from durableruns.encoding import storable
from durableruns.models import (
    Escalation,
    InboxItem,
    Intervention,
    RunAttribute,
    RunState,
    RunStatus,
    RunStep,
    WorkerPresence,
)
from durableruns.store.base import DATABASE


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


# -- retention and alerts (durableruns.ops): the other writes, kept here with the rest ---------------------

# Children first: inbox items and interventions point at escalations, everything points at the run.
_RUN_TABLES = (
    ("inbox_items", InboxItem._meta.db_table),
    ("interventions", Intervention._meta.db_table),
    ("escalations", Escalation._meta.db_table),
    ("attempts", RunStep._meta.db_table),
    ("attributes", RunAttribute._meta.db_table),
    ("runs", RunState._meta.db_table),
)


def delete_runs(ids: list[str], *, finished: tuple[str, ...] = ()) -> dict[str, int]:
    """Delete the runs `ids` (locked by the caller's transaction) and what hangs on them, by primary key list:
    plain DELETEs, not Django's collector, which would first read every row (inputs and results included).
    Return how many rows went from each: inbox items, interventions, escalations, attempts, attributes, runs.

    With `finished` (a record distributed by Citus, where the caller cannot lock a batch spread over the shards),
    the runs still in one of those statuses are deleted first, their row locks taken by that DELETE (a run
    reopened meanwhile stays, with everything of its), and then what hangs on the runs deleted."""
    deleted = {}
    if finished:
        with connections[conf.database()].cursor() as cursor:
            # The reference tables (escalations, decisions) are written after a multi-shard statement in this
            # transaction, which Citus allows only over one connection per node.
            cursor.execute("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")
            cursor.execute(f"DELETE FROM {RunState._meta.db_table} WHERE run_id = ANY(%s) AND status = ANY(%s) "
                           "RETURNING run_id", [ids, list(finished)])
            ids = [run_id for (run_id,) in cursor.fetchall()]
            deleted["runs"] = len(ids)
        if not ids:
            return {counter: 0 for counter, _ in _RUN_TABLES}
    placeholders = ", ".join(["%s"] * len(ids))
    with connections[conf.database()].cursor() as cursor:
        for counter, table in _RUN_TABLES:
            if counter in deleted:
                continue
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
