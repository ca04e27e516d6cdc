"""The workflow `late_pay`, for the crash matrix's far calls that land late (tests/faults/test_crash_matrix.py).

`pay` books at the carrier (which does not deduplicate: a second booking under a key is a second effect) through
a call its far system commits only later (tests.faults.landing): up to LANDS_WITHIN after the call, inside the
step's timeout. Its worker is killed right after making the call, with or without a lease renewal first. A resume
must then not trust "not found" before the last moment the dead worker could still have called (the lease it held)
plus the timeout. `pay` is an acquisition, so a cancel must settle it before giving it back.

`declare(version)`: "v1" (pay, done) or "v2" (pay, done, thank), each deploy replacing the one before, for the
adopt_plan path. Worker processes load this module with LATE_PAY_DEPLOY naming their deploy (v2).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from durableruns import Workflow, testing
from durableruns.models import RunStep
from project.purchasing.far import systems

TIMEOUT = timedelta(seconds=30)
LANDS_WITHIN = TIMEOUT.total_seconds() - 0.5  # the far commit lands inside the call's timeout
ROOT = Path(__file__).resolve().parents[2]


def released(run_id: str) -> list[str]:
    """The releases given for run `run_id`'s booking, one line each."""
    path = Path(os.environ["FAR_DIR"]) / "released" / run_id
    return path.read_text().splitlines() if path.exists() else []


def _find(ctx: Any) -> dict[str, Any] | None:
    return systems().carrier.lookup(ctx.effect_key)


def _give_back(ctx: Any) -> dict[str, Any]:
    folder = Path(os.environ["FAR_DIR"]) / "released"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ctx.run_id, "a") as ledger:
        ledger.write(f"{ctx.effect_key}\n")
    return {"released": True}


def pay(ctx: Any) -> dict[str, Any]:
    if ctx.input.get("after_renewal"):  # work on until the heartbeat has renewed the lease once
        mine = RunStep.objects.filter(run_id=ctx.run_id, step="pay", attempt=ctx.attempt, renewed_at__isnull=False)
        deadline = time.monotonic() + 30
        while not mine.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    time.sleep(float(ctx.input.get("work", 1.0)))
    subprocess.Popen([sys.executable, "-m", "tests.faults.landing", ctx.effect_key, str(LANDS_WITHIN),
                      ctx.input.get("gate", "")], cwd=ROOT, start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    testing.reached("after_effect", "pay")
    deadline = time.monotonic() + TIMEOUT.total_seconds()  # a live caller waits for its answer
    while time.monotonic() < deadline:
        found = systems().carrier.lookup(ctx.effect_key)
        if found is not None:
            return found
        time.sleep(0.05)
    raise TimeoutError("the carrier did not answer in time")


def done(ctx: Any) -> dict[str, Any]:
    return {"paid": True}


def thank(ctx: Any) -> dict[str, Any]:
    return {"thanked": True}


def declare(version: str) -> Workflow:
    """Declare `late_pay` as deploy `version` has it."""
    workflow = Workflow("late_pay", replace=True)
    workflow.step(policy="resolvable", lookup=_find, lookup_lag=timedelta(0), timeout=TIMEOUT,
                  release=_give_back)(pay)
    workflow.step(policy="re_executable")(done)
    if version == "v2":
        workflow.step(policy="re_executable")(thank)
    return workflow


if os.environ.get("LATE_PAY_DEPLOY"):
    declare(os.environ["LATE_PAY_DEPLOY"])
