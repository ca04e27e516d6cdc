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


# The partition rig (tests/faults/test_partition.py): a booking that holds the run for input["hold"] seconds after
# the carrier accepted it, so a host can be cut off from PostgreSQL in the middle of the step; then a keyed charge
# and an email. The carrier does not deduplicate and the email sender has no key: a second booking or email
# under one run would show in their ledgers.
rig = Workflow("rig")


@rig.step(policy="resolvable", lookup=find_shipment, lookup_lag=timedelta(0), timeout=timedelta(seconds=1))
def book_parcel(ctx: Any) -> dict[str, Any]:
    result = systems().carrier.book(key=ctx.effect_key, address="1 Rig Street", parcels=1)
    testing.reached("after_effect", "book_parcel")
    time.sleep(float(ctx.input.get("hold", 0)))
    return result


@rig.step(policy="resolvable", lookup=find_charge, lookup_lag=timedelta(0), timeout=timedelta(seconds=1))
def charge_card(ctx: Any) -> dict[str, Any]:
    return systems().payments.charge(amount=100, currency="EUR", idempotency_key=ctx.effect_key)


@rig.step(policy="escalate")
def confirm_by_email(ctx: Any) -> dict[str, Any]:
    """Email the buyer that the parcel is booked. No lookup: check the outbox for the run id by hand."""
    return systems().email.send(to="buyer@rig", subject=f"{ctx.run_id}:booked", body="booked and paid")
