"""Wait for a run to end and hand back its results by step: what `durableruns.result(run_id)` does.

On PostgreSQL the caller LISTENs on ENDED_CHANNEL before it first reads the record, on a connection of its own, and
records itself as the run's waiter there (store.await_end); the trigger run_state_ended (migrations 0019, 0029)
notifies that channel with the run_id on the commit that ends a run someone waits for (completed, failed or
cancelled), whichever path ends it. A run that ends between the LISTEN and the read is
seen by the read; one that ends after it is heard. The record is read again every RECHECK_SECONDS even without a
notification; without a listening connection (none could be made, or it was lost) the caller polls instead.
Elsewhere (SQLite) the caller polls the record every POLL_SECONDS.

The timeout is the caller's own wait, measured on its monotonic clock; nothing of the run's is decided by it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from durableruns import conf, store
from durableruns.boundary import compute_boundary
from durableruns.distribution import on_one_node
from durableruns.errors import RunCancelled, RunFailed, RunNotFound
from durableruns.models import RunState, RunStatus, RunStep

ENDED_CHANNEL = "durableruns_ended"
POLL_SECONDS = 0.05
RECHECK_SECONDS = 5.0


def wait_for_result(run_id: str, *, timeout: float | None = None) -> dict[str, Any]:
    """Return the results of the run by step ({step: result}, as ctx.results has them) once it has completed.

    RunFailed or RunCancelled (with the run's reason) if it ended otherwise; RunNotFound if no run has that id;
    TimeoutError if it has not ended after `timeout` seconds (None: wait for as long as it takes)."""
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    alias = RunState.objects.db
    # On Citus the trigger that announces ends is gone (durableruns.distribution): poll, as on SQLite.
    if on_one_node(alias):
        with _hearing_ends(run_id) as pause:
            return _wait(run_id, deadline, timeout, pause, RECHECK_SECONDS)
    return _wait(run_id, deadline, timeout, time.sleep, POLL_SECONDS)


def _wait(
    run_id: str, deadline: float | None, timeout: float | None, pause: Callable[[float], None], interval: float
) -> dict[str, Any]:
    while True:
        results = _ended(run_id)
        if results is not None:
            return results
        left = interval if deadline is None else deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"run {run_id} did not end within {timeout:g} s")
        pause(min(left, interval))


def _ended(run_id: str) -> dict[str, Any] | None:
    """The run's results if it completed; None while it has not ended; RunFailed / RunCancelled otherwise."""
    row = RunState.objects.filter(pk=run_id).values_list("status", "reason").first()
    if row is None:
        raise RunNotFound(run_id=run_id)
    status, reason = row
    if status == RunStatus.FAILED:
        raise RunFailed(run_id=run_id, reason=reason)
    if status == RunStatus.CANCELLED:
        raise RunCancelled(run_id=run_id, reason=reason)
    if status != RunStatus.COMPLETED:
        return None
    # As ctx.results has them: the latest attempt's result of each step done, through the run's own plan.
    run = RunState.objects.only("workflow", "plan_fingerprint").get(pk=run_id)
    attempts = [row.to_attempt() for row in RunStep.objects.of_run(run_id)]
    plan = store.plan_of(run.workflow, run.plan_fingerprint)
    if plan is None:
        b = compute_boundary(tuple(dict.fromkeys(a.step for a in attempts)), attempts)
    else:
        b = compute_boundary(plan.names, attempts, waits=plan.waits)
    return {step: b.latest[step].result for step in b.done}


@contextmanager
def _hearing_ends(run_id: str) -> Iterator[Callable[[float], None]]:
    """LISTEN on ENDED_CHANNEL on a connection of its own (on DURABLERUNS_LISTEN_DATABASE, which reaches
    PostgreSQL directly where a pooler sits in between); yield a pause that returns when `run_id`'s end is heard,
    or after the seconds it is given. Without that connection (it could not be made, or was lost) the pause is
    POLL_SECONDS at most: the caller polls instead."""
    import psycopg  # here: a SQLite-only site installs durableruns without the [postgres] extra

    from durableruns.connections import plain_params

    conn: psycopg.Connection[Any] | None = None
    waiter: int | None = None
    try:
        conn = psycopg.connect(**plain_params(conf.listen_database()), autocommit=True)
        conn.execute(f"LISTEN {ENDED_CHANNEL}")
        # Only a run someone waits for notifies at its end (RunWaiter): registered after the LISTEN, before the
        # first read of the record.
        waiter = store.await_end(conn, run_id)
    except psycopg.Error:
        if conn is not None:
            conn.close()
        conn = None

    def pause(seconds: float) -> None:
        nonlocal conn
        if conn is not None:
            try:
                for note in conn.notifies(timeout=seconds):
                    if note.payload == run_id:
                        return
                return
            except psycopg.Error:
                conn.close()
                conn = None
        time.sleep(min(seconds, POLL_SECONDS))

    try:
        yield pause
    finally:
        if conn is not None:
            try:
                if waiter is not None:
                    store.forget_waiter(conn, waiter)
            except psycopg.Error:
                pass  # left behind, it only makes this run's end notify
            conn.close()
