"""What every module of the store shares: the lease a worker holds, what a claim hands the engine, an
intent, the database's clock, JSON and text as the record stores them, and the fences every write begins with.

A worker's writes are conditional updates `WHERE run_id = ... AND epoch = <its epoch>`, issued first in each
transaction: on PostgreSQL the update takes the row lock, so a concurrent claim either committed before (zero
rows: FencedOut, nothing written) or waits until this fact is committed. A step's row moves forward once,
started -> completed or failed, by a conditional update on its status.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connections

from durableruns import conf
from durableruns.boundary import StepAttempt
from durableruns.clock import Clock
from durableruns.errors import FencedOut, ResultNotJSON
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


def wake_workers() -> None:
    """Wake idle workers when this transaction commits (PostgreSQL; elsewhere they poll)."""
    if connections[conf.database()].vendor == "postgresql":
        notify_workers()


def fast() -> bool:
    """Use the one-statement PostgreSQL path; a statement outside any transaction is its own commit."""
    db = connections[conf.database()]  # one lookup of this thread's connection, not one per attribute
    if db.vendor != "postgresql":
        return False
    if db.in_atomic_block:
        raise RuntimeError("durableruns records each fact in its own transaction: call it outside atomic()")
    return True


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
