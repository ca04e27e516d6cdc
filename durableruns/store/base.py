"""What every module of the store shares: the lease a worker holds, what a claim hands the engine, an
intent, the database's clock, and the fences every write begins with.

A worker's writes are conditional updates `WHERE run_id = ... AND epoch = <its epoch>`, issued first in each
transaction: on PostgreSQL the update takes the row lock, so a concurrent claim either committed before (zero
rows: FencedOut, nothing written) or waits until this fact is committed. A step's row moves forward once,
started -> completed or failed, by a conditional update on its status.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connections

from durableruns import conf
from durableruns.boundary import StepAttempt
from durableruns.clock import Clock
from durableruns.distribution import is_distributed
from durableruns.errors import FencedOut
from durableruns.models import RunState, RunStatus, RunStep, StepStatus
from durableruns.store.sql import notify_workers


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
    key_run_id: str | None = None  # the run whose effect keys its steps keep (a restart's original), if not its own
    overdue: bool = False  # its deadline had passed when it was claimed: the engine ends it (durableruns.deadlines)
    takeovers: int = 0  # claims in a row that took it over from a dead worker, cursor unmoved (store.claims)


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


# A claim that takes a run over from a worker whose lease ran out (it was still running) counts it, from 1 again if
# the cursor moved since the last claim; any other claim (the run was handed back, set to wait, retried by staff)
# starts the count anew. The engine stops a run for staff once the count reaches the crash budget while nothing
# is recorded in doubt (passes.crash_loop): steps declared intent=False leave no attempt to count. SET clauses of
# the claims' UPDATE of run_state (store.claims, store.spread; the ORM's claim: store.claims.takeovers_after).
TAKEOVER_COUNT = """CASE WHEN run_state.status <> 'running' THEN 0
                      WHEN run_state.takeover_cursor = run_state.cursor THEN coalesce(run_state.takeovers, 0) + 1
                      ELSE 1 END"""
TAKEOVERS = "takeovers = " + TAKEOVER_COUNT + ",\n         takeover_cursor = run_state.cursor"


# The reason of a run started with a run_after: waiting, with that time as its wake time, until it is due.
DEFERRED = "deferred: not due before its wake time"


def wake_workers() -> None:
    """Wake idle workers when this transaction commits (PostgreSQL; elsewhere they poll)."""
    if connections[conf.database()].vendor == "postgresql":
        notify_workers()


def fast() -> bool:
    """Use the one-statement PostgreSQL path; a statement outside any transaction is its own commit.

    Not on a record distributed by Citus (durableruns.distribution): several of those statements reach beyond the
    run they fence (a parent's wake, a key's parked runs), which Citus cannot route to one shard; there each fact
    is the ORM's transaction of statements that each name the run, all on the run's shard, one commit there."""
    db = connections[conf.database()]  # one lookup of this thread's connection, not one per attribute
    if db.vendor != "postgresql":
        return False
    if db.in_atomic_block:
        raise RuntimeError("durableruns records each fact in its own transaction: call it outside atomic()")
    return not is_distributed(conf.database())


def lease_times(lease: Lease, clock: Clock) -> dict[str, timedelta]:
    """What the hot path's statements add to the database's now(): the clock's shift and the lease."""
    return {"shift": clock.shift, "lease": lease.duration}


def fence(lease: Lease, clock: Clock, **fields: Any) -> None:
    moved = RunState.objects.filter(pk=lease.run_id, epoch=lease.epoch).update(
        updated_at=clock.expression(), lease_expires_at=clock.expression(lease.duration), **fields
    )
    if not moved:
        raise FencedOut(run_id=lease.run_id, epoch=lease.epoch)


def finish_attempt(lease: Lease, step: str, attempt: int, **fields: Any) -> None:
    moved = RunStep.objects.filter(
        run_id=lease.run_id, step=step, attempt=attempt, status=StepStatus.STARTED
    ).update(**fields)
    if not moved:
        raise FencedOut(
            f"attempt {attempt} of {step} is no longer started", run_id=lease.run_id, epoch=lease.epoch
        )


def decoded(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


ENDED = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)
