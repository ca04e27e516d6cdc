"""A step's rate limit in the record: the turn an attempt takes before it acts, or the moment it waits for, with
the log of starts and given turns per (step, key) (run_rate_turn; the arithmetic is durableruns.rates).

Turns of one (step, key) are taken one at a time across every worker and host: on PostgreSQL under a transaction
advisory lock on the bucket, taken after the run's own row (the fence), so a turn is decided on the log as the
last committed turn left it, and the start is recorded at the database's now() read after the lock; on SQLite
every write transaction begins IMMEDIATE (durableruns.sqlite), which serializes them the same way. A run that
must wait is handed back in the same commit that gives it its turn: waiting, its wake time that turn, holding
no lease.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connections, transaction

from durableruns import conf
from durableruns.clock import Clock
from durableruns.encoding import storable
from durableruns.models import RateTurn, RunState, RunStatus
from durableruns.rates import Rate, turn, waiting_reason
from durableruns.store.base import DATABASE, Lease, fence, wake_workers

# One lock per (step, key), held to the commit: the bucket's name hashed to the 64-bit advisory key space (a
# collision only makes two buckets take turns one after the other, never lets one pass its limit).
_LOCK_BUCKET = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"


def _bucket(step: str, key: str) -> str:
    return f"durableruns.rate:{len(step)}:{step}:{key}"


def turn_of(run_id: str, step: str) -> tuple[str, datetime] | None:
    """The turn the run holds for `step` (its key and time), if it waits for one: its key was asked when the
    turn was given and is not asked again."""
    row = (RateTurn.objects.using(conf.database()).filter(run_id=run_id, step=step, started=False)
           .values_list("key", "at").order_by("-at").first())
    return None if row is None else (row[0], row[1])


def take_turn(lease: Lease, *, step: str, key: str, rate: Rate, clock: Clock = DATABASE) -> datetime | None:
    """Take the attempt's turn under `rate`: None when it may start now (its start recorded at the database's
    now), else the time its turn comes, recorded, with the run handed back waiting until then in the same commit.
    Entries of the bucket older than its window (and DURABLERUNS_RATE_MARGIN_SECONDS) are deleted here: they can
    no longer count."""
    database = conf.database()
    bucket = RateTurn.objects.using(database).filter(step=step, key=key)
    with transaction.atomic(using=database, durable=True):
        fence(lease, clock)  # the run's row first, as every write: a stale epoch writes nothing
        connection = connections[database]
        if connection.vendor == "postgresql":  # a statement of its own: each read below takes its snapshot after
            with connection.cursor() as cursor:  # the lock, so it sees the turn the last holder committed
                cursor.execute(_LOCK_BUCKET, [_bucket(step, key)])
        now = clock.now()  # after the lock: later than every start the log holds
        margin = conf.rate_margin()
        horizon = now - rate.window - margin
        bucket.filter(at__lte=horizon).delete()
        mine = (bucket.filter(run_id=lease.run_id, started=False).order_by("-at").values_list("pk", "at").first())
        others = bucket.filter(at__gt=horizon).exclude(pk=mine[0]) if mine else bucket.filter(at__gt=horizon)
        recent = list(others.order_by("-at").values_list("at", "started")[: rate.limit])
        starts = list(bucket.filter(started=True, at__gt=horizon).order_by("-at")
                      .values_list("at", flat=True)[: rate.limit])
        decided = turn(rate, now=now, starts=starts, reserved=[at for at, started in recent if not started],
                       mine=mine[1] if mine else None, margin=margin)
        if decided.go:
            if mine:
                bucket.filter(pk=mine[0]).update(at=now, started=True)
            else:
                RateTurn.objects.using(database).create(step=step, key=key, at=now, run_id=lease.run_id, started=True)
            return None
        if mine:
            bucket.filter(pk=mine[0]).update(at=decided.at)
        else:
            RateTurn.objects.using(database).create(step=step, key=key, at=decided.at, run_id=lease.run_id)
        RunState.objects.using(database).filter(pk=lease.run_id, epoch=lease.epoch).update(
            status=RunStatus.WAITING, wake_at=decided.at, reason=storable(waiting_reason(step, key, decided.at)),
            lease_expires_at=None, updated_at=clock.expression())
        wake_workers()  # idle workers learn the new earliest wake time
    return decided.at


def waiting_turns(run_id: str) -> dict[str, tuple[str, datetime]]:
    """Step -> (key, time) of each turn the run waits for: what its boundary says."""
    return {step: (key, at) for step, key, at in RateTurn.objects.using(conf.database())
            .filter(run_id=run_id, started=False).order_by("at").values_list("step", "key", "at")}
