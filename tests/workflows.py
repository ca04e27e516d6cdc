"""Workflows the test suite runs, in-process and in worker subprocesses (DURABLERUNS_WORKFLOW_MODULES).

`order` touches far systems that count their effects: a re-executable loop, a payment that honours its key
(resolvable), a shipment that does not (resolvable by lookup), and an email nobody can look up (escalate).
Lags come from the environment so a test can shrink them for the worker processes it starts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from datetime import timedelta
from typing import Any

from durableruns import Rejected, Workflow, testing
from project.purchasing.far import FarRejected, systems


def _seconds(name: str, default: float) -> timedelta:
    return timedelta(seconds=float(os.environ.get(name, default)))


LAG = _seconds("TEST_LOOKUP_LAG", 0.3)
TIMEOUT = _seconds("TEST_STEP_TIMEOUT", 0.2)

order = Workflow("order")


@order.step(policy="re_executable")
def prepare(ctx: Any) -> dict[str, Any]:
    """Price 60 lines, checkpointing every 10; each priced line is counted in the email ledger's twin."""
    priced = ctx.progress.setdefault("priced", [])
    for line in ctx.loop(list(range(60)), every=10):
        systems().email.send(to="loop@test", subject=f"{ctx.run_id}:line", body=str(line))
        priced.append(line)
        time.sleep(float(os.environ.get("TEST_LINE_SECONDS", 0)))
        mark = os.environ.get("TEST_MARK_AT_LINE_15")
        if mark and line == 15 and ctx.attempt == 1:
            Path(mark).touch()  # the test pauses the worker here: outside any far call or transaction
            time.sleep(3)
    return {"total": sum(priced) + ctx.input.get("extra", 0), "lines": len(priced)}


def find_charge(ctx: Any) -> dict[str, Any] | None:
    return systems().payments.lookup(ctx.effect_key)


@order.step(policy="resolvable", lookup=find_charge, lookup_lag=LAG, timeout=TIMEOUT, fails_on=FarRejected)
def charge(ctx: Any) -> dict[str, Any]:
    result = systems().payments.charge(amount=ctx.results["prepare"]["total"] + 100, currency="EUR",
                                       idempotency_key=ctx.effect_key)
    testing.reached("after_effect", "charge")
    return result


def find_shipment(ctx: Any) -> dict[str, Any] | None:
    return systems().carrier.lookup(ctx.effect_key)


@order.step(policy="resolvable", lookup=find_shipment, lookup_lag=LAG, timeout=TIMEOUT)
def ship(ctx: Any) -> dict[str, Any]:
    result = systems().carrier.book(key=ctx.effect_key, address="1 Test Street", parcels=1)
    testing.reached("after_effect", "ship")
    return result


@order.step(policy="escalate")
def notify(ctx: Any) -> dict[str, Any]:
    """Email the buyer. The sender has no lookup: check the outbox for the run id by hand."""
    result = systems().email.send(to="buyer@test", subject=f"{ctx.run_id}:shipped", body="on its way")
    testing.reached("after_effect", "notify")
    return result


# A workflow whose steps are told how to behave by the run's input, for engine rules in isolation.
scripted = Workflow("scripted")


def _script(ctx: Any) -> Any:
    behaviour = ctx.input.get(ctx.step, "ok")
    if behaviour == "reject":
        raise Rejected(f"{ctx.step} refused")
    if behaviour == "reject_once" and ctx.attempt == 1:
        raise Rejected(f"{ctx.step} refused once")
    if behaviour == "boom":
        raise ConnectionError(f"{ctx.step}: connection reset")
    if behaviour == "not_json":
        return {"when": object()}
    if behaviour == "sleep":
        time.sleep(float(ctx.input.get("sleep", 1.0)))
    return {"step": ctx.step, "attempt": ctx.attempt, "key": ctx.effect_key}


def _lookup(ctx: Any) -> Any:
    found = ctx.input.get("lookup")
    if found == "raise":
        raise TimeoutError("lookup endpoint timed out")
    return found


@scripted.step(policy="re_executable", max_attempts=3)
def first(ctx: Any) -> Any:
    return _script(ctx)


@scripted.step(policy="resolvable", lookup=_lookup, lookup_lag=timedelta(seconds=60),
               timeout=timedelta(seconds=30), max_attempts=3)
def second(ctx: Any) -> Any:
    return _script(ctx)


@scripted.step(policy="escalate")
def third(ctx: Any) -> Any:
    """Nobody can look this up; decide by hand."""
    return _script(ctx)


# A step that acts once, then holds the run for several leases: what the heartbeat must keep it through.
heartbeat_probe = Workflow("heartbeat_probe")


@heartbeat_probe.step(policy="re_executable")
def hold(ctx: Any) -> dict[str, Any]:
    systems().email.send(to="ops@test", subject=f"{ctx.run_id}:hold", body=f"attempt {ctx.attempt}")
    time.sleep(float(os.environ.get("TEST_HOLD_SECONDS", 4)))
    return {"attempt": ctx.attempt}


# Two steps that wait as a far call would (input "nap" seconds each): what a worker pool overlaps.
pool_napping = Workflow("pool_napping")


@pool_napping.step(policy="re_executable")
def nap(ctx: Any) -> dict[str, Any]:
    time.sleep(float(ctx.input.get("nap", 0.5)))
    return {"napped": True}


@pool_napping.step(policy="re_executable")
def after_nap(ctx: Any) -> dict[str, Any]:
    time.sleep(float(ctx.input.get("nap", 0.5)))
    return {}


# A step that blocks far past its declared timeout: the watchdog must name it while the other threads go on.
stuck_probe = Workflow("stuck_probe")


@stuck_probe.step(policy="re_executable", timeout=timedelta(seconds=0.2))
def blocks(ctx: Any) -> dict[str, Any]:
    time.sleep(float(os.environ.get("TEST_STUCK_SECONDS", 4)))
    return {}


# Two acquisitions at the warehouse, a step that can be told to fail, and one a person decides: what a run that
# ends unfinished must give back (releases in reverse order of completion), and what it holds meanwhile.
holding = Workflow("holding")


def _give_back(acquired: str) -> Any:
    def release(ctx: Any) -> dict[str, Any]:
        if ctx.attempt <= int(ctx.input.get(f"{ctx.step}:reject", 0)):
            raise Rejected(f"{ctx.step}: the warehouse refused the release")
        result = systems().warehouse.release(ctx.results[acquired]["reservation_id"], key=ctx.effect_key)
        testing.reached("after_effect", ctx.step)
        return result

    release.__name__ = f"release_{acquired}"
    return release


def find_reservation(ctx: Any) -> dict[str, Any] | None:
    return systems().warehouse.find_reservation(ctx.effect_key)


def find_release(ctx: Any) -> dict[str, Any] | None:
    return systems().warehouse.find_release(ctx.effect_key)


@holding.step(policy="re_executable", release=_give_back("lock"), max_attempts=2)
def lock(ctx: Any) -> dict[str, Any]:
    result = systems().warehouse.reserve(1, key=ctx.effect_key)
    testing.reached("after_effect", "lock")
    return result


@holding.step(policy="resolvable", lookup=find_reservation, timeout=TIMEOUT, release=_give_back("reserve"),
              release_lookup=find_release, hold_expires_after=timedelta(hours=4))
def reserve(ctx: Any) -> dict[str, Any]:
    result = systems().warehouse.reserve(3, key=ctx.effect_key)
    testing.reached("after_effect", "reserve")
    return result


@holding.step(policy="re_executable", max_attempts=2)
def pay(ctx: Any) -> Any:
    return _script(ctx)


@holding.step(policy="escalate")
def confirm(ctx: Any) -> Any:
    """Nobody can look this up; decide by hand."""
    return _script(ctx)
