"""Schedules with real worker processes: three resume_runs --loop workers and a cron resume_runs --once, every
one of them starting slots of a two-second schedule (a cron expression with seconds) for half a minute. Exactly
one run per slot, none missed, each worked once; and the --loop workers start each slot as it comes (their
timetable wakes for it), not only when cron passes."""

from __future__ import annotations

import signal
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from durableruns.models import RunState, RunStatus
from tests.conftest import Workers
from tests.logs import stray_tracebacks

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "every2s"


def slot_of(run_id: str) -> datetime:
    return datetime.strptime(run_id.split("@", 1)[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def test_three_loop_workers_and_cron_start_exactly_one_run_per_slot(workers: Workers, tmp_path: Path):
    ledger = tmp_path / "ledger"
    env = {"DURABLERUNS_WORKFLOW_MODULES": "tests.workflows,tests.timetable", "TIMETABLE_CRON": "*/2 * * * * *",
           "TIMETABLE_NAME": NAME, "TIMETABLE_CATCH_UP": "all", "TIMETABLE_LEDGER": str(ledger)}
    loops = [workers.start("--loop", "--interval", "5", "--lease", "2", "--worker", f"loop-{n}", **env)
             for n in range(3)]
    began = time.monotonic()
    crons = 0
    while time.monotonic() - began < 30:  # cron passes too, every few seconds, while the --loop workers run
        done = workers.run("--once", "--worker", f"cron-{crons}", **env)
        assert done.returncode == 0, done.stdout + done.stderr
        crons += 1
        time.sleep(4)
    for proc in loops:
        proc.send_signal(signal.SIGTERM)
    for proc in loops:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and not stray_tracebacks(err), out + err
    final = workers.run("--once", "--worker", "cron-last", **env)  # works what was left pending
    assert final.returncode == 0, final.stdout + final.stderr

    rows = list(RunState.objects.filter(run_id__startswith=f"{NAME}@").values_list("run_id", "status",
                                                                                    "created_at"))
    slots = sorted(slot_of(run_id) for run_id, _, _ in rows)
    assert len(slots) >= 10, f"only {len(slots)} slots in 30 s"
    # Every slot from the first to the last, two seconds apart, exactly once.
    assert slots == [slots[0] + timedelta(seconds=2 * i) for i in range(len(slots))]
    assert {status for _, status, _ in rows} == {RunStatus.COMPLETED}
    called = ledger.read_text().splitlines()
    assert sorted(called) == sorted(run_id for run_id, _, _ in rows)  # each slot's run worked once
    # The --loop workers start a slot as it comes: cron alone (every ~5 s) would start most of them seconds late.
    late = [(created - slot_of(run_id)).total_seconds() for run_id, _, created in rows]
    assert statistics.median(late) < 1.0, sorted(late)
    print(f"{len(slots)} slots, {crons} cron passes; started {statistics.median(late):.3f} s after the slot "
          f"(median), {max(late):.3f} s at most")
