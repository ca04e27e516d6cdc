"""A stopping worker (SIGTERM) gives the step in hand the shutdown grace and no more, at every concurrency: one
thread (always so on SQLite) as well as several. Past the grace the step is left in doubt, exactly as after a
crash, and the next worker settles it by its policy."""

from __future__ import annotations

import signal
import time

import pytest
from django.db.models.functions import Now

from durableruns import services, store
from durableruns.models import RunState, RunStatus, RunStep
from tests.conftest import wait_until
from tests.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)

GRACE = 2.0  # seconds: DURABLERUNS_SHUTDOWN_GRACE_SECONDS of the stopping worker
STEP = 15.0  # seconds the step in hand sleeps: far past the grace
LEASE = 3.0  # the worker's lease, so the next worker can take the run soon after the first is gone
# From SIGTERM to the process's end: the grace, then the way out (the heartbeat and the watchdog stop, the
# summary is written, the interpreter exits). Today's one-thread worker took the whole step (15 s).
EXIT_BOUND = GRACE + 3.0


@pytest.mark.parametrize("concurrency", ["1", "4"])
def test_sigterm_during_a_long_step_exits_after_the_grace_and_the_run_resumes(workers, concurrency):
    run_id = make_run("shutdown_probe")
    worker = workers.start("--loop", "--concurrency", concurrency, "--interval", "0.1", "--lease", str(LEASE),
                           "--worker", "stopping", DURABLERUNS_SHUTDOWN_GRACE_SECONDS=str(GRACE),
                           TEST_SLOW_SECONDS=str(STEP))
    wait_until(lambda: RunStep.objects.filter(run_id=run_id, step="slow", status="started").exists(),
               what="the long step to start")
    signalled = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=STEP + 10)  # an old-style worker ends with its step: fail, not hang
    took = time.monotonic() - signalled
    assert took < EXIT_BOUND, f"exited {took:.1f}s after SIGTERM with a {GRACE:g}s grace\n{err}"
    assert took >= GRACE - 0.1, f"exited {took:.1f}s after SIGTERM: before the {GRACE:g}s grace ended"
    assert worker.returncode == 0, err
    assert "still in a step after the 2s grace period; leaving them" in err, err
    # As after a crash: the step's intent is committed and its result is not (in doubt); nothing is marked
    # failed, the run is still the stopped worker's until its lease runs out.
    [attempt] = RunStep.objects.filter(run_id=run_id)
    assert (attempt.step, attempt.attempt, attempt.status, attempt.finished_at) == ("slow", 1, "started", None)
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.RUNNING and run.owner.startswith("stopping"), (run.status, run.owner)
    # The next worker, once the lease has run out (on the database's clock), settles the step by its policy
    # (re_executable: run again) and finishes the run.
    wait_until(lambda: RunState.objects.filter(pk=run_id, lease_expires_at__lt=Now()).exists(), timeout=LEASE + 10,
               what="the stopped worker's lease to run out")
    done = workers.run("--once", "--worker", "next", TEST_SLOW_SECONDS="0")
    assert done.returncode == 0, done.stderr
    run = RunState.objects.get(pk=run_id)
    assert (run.status, run.cursor) == (RunStatus.COMPLETED, 2), (run.status, run.reason)
    steps = list(RunStep.objects.filter(run_id=run_id).order_by("step", "attempt").values_list(
        "step", "attempt", "status"))
    assert steps == [("after_slow", 1, "completed"), ("slow", 1, "started"), ("slow", 2, "completed")], steps


@pytest.mark.parametrize("concurrency", [1, 2])
def test_what_a_worker_thread_raises_outside_a_runs_turn_is_raised_by_the_pass(monkeypatch, concurrency):
    """Off the main thread, a bug outside any run's turn (here in the claim) still stops the pass and reaches the
    caller, as it did when one thread worked on the main thread; it is not lost in a thread that dies alone."""
    make_run("shutdown_probe")

    def broken(**kwargs):
        raise RuntimeError("bug in the claim")

    monkeypatch.setattr(store, "claim", broken)
    with pytest.raises(RuntimeError, match="bug in the claim"):
        services.resume_due(concurrency=concurrency, grace=GRACE)
