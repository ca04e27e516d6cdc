"""Workflows the test suite runs, in-process and in worker subprocesses (DURABLERUNS_WORKFLOW_MODULES).

`order` touches far systems that count their effects: a re-executable loop, a payment that honours its key
(resolvable), a shipment that does not (resolvable by lookup), and an email nobody can look up (escalate).
Lags come from the environment so a test can shrink them for the worker processes it starts.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sqlite3
import time
from pathlib import Path
from datetime import timedelta
from typing import Any

from django.db.models import F

from durableruns import Rejected, Workflow, testing
from project.purchasing.far import CreditVendor, FarRejected, systems
from project.purchasing.far.ledger import Effect


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


# A long step and a short one (TEST_SLOW_SECONDS, from the worker's environment): a SIGTERM in the long one must
# end the worker after the shutdown grace, whatever its concurrency, and leave that step in doubt.
shutdown_probe = Workflow("shutdown_probe")


@shutdown_probe.step(policy="re_executable", timeout=timedelta(seconds=60))
def slow(ctx: Any) -> dict[str, Any]:
    time.sleep(float(os.environ.get("TEST_SLOW_SECONDS", 0)))
    return {"slept": True}


@shutdown_probe.step(policy="re_executable")
def after_slow(ctx: Any) -> dict[str, Any]:
    return {}


# The partition rig (tests/faults/test_partition.py): a booking that holds the run for input["hold"] seconds after
# the carrier accepted it, so a host can be cut off from PostgreSQL in the middle of the step; then a keyed charge
# and an email. The carrier does not deduplicate and the email sender has no key: a second booking or email
# under one run would show in their ledgers.
rig = Workflow("rig")


@rig.step(policy="resolvable", lookup=find_shipment, lookup_lag=timedelta(0), timeout=timedelta(seconds=1))
def book_parcel(ctx: Any) -> dict[str, Any]:
    result = systems().carrier.book(key=ctx.effect_key, address="1 Rig Street", parcels=[{"kg": 1}])
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


# The clock-skew tests (tests/faults/test_clock_skew.py) run workers whose wall clock libfaketime shifts. The far
# systems those workers call keep their own, true clock: a far system's lag runs on the far system's clock, and a
# caller's wrong clock must not make its lookup see what it has not published yet.
_CLOCK_GETTIME = {"x86_64": 228, "aarch64": 113}.get(platform.machine())


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def far_clock() -> float:
    """The real wall clock, read by the raw clock_gettime system call, which libfaketime does not intercept."""
    if _CLOCK_GETTIME is None:
        return time.time()
    spec = _Timespec()
    if ctypes.CDLL(None, use_errno=True).syscall(_CLOCK_GETTIME, 0, ctypes.byref(spec)) != 0:  # CLOCK_REALTIME
        raise OSError(ctypes.get_errno(), "clock_gettime")
    return spec.tv_sec + spec.tv_nsec / 1e9


class LaggingCredit(CreditVendor):
    """The credit vendor (same ledger: no deduplication, so a second check is a second effect) whose lookup sees a
    check only FAR_CREDIT_LOOKUP_LAG seconds after it was made, both times read on the far system's own clock."""

    def _insert(self, conn: sqlite3.Connection, *, key: str | None, payload: str, **extra: object) -> Effect:
        effect = super()._insert(conn, key=key, payload=payload, **extra)
        effect["created_at"] = far_clock()
        conn.execute("UPDATE effects SET created_at = ? WHERE id = ?", (effect["created_at"], effect["id"]))
        return effect

    def lookup(self, request_id: str) -> dict[str, Any] | None:
        with self._reading() as conn:
            row = conn.execute("SELECT * FROM effects WHERE key = ? AND ? - created_at >= ? ORDER BY id LIMIT 1",
                               (request_id, far_clock(), self.config.lookup_lag)).fetchone()
        return None if row is None else self._result(self._effect(row))


# (a) An escalate step that emails and then holds the run, renewing its lease, until the test lets it go (at most
# input["hold_max"] seconds): a worker whose clock runs ahead must not take it from its live owner meanwhile.
slow_notice = Workflow("slow_notice")


@slow_notice.step(policy="escalate")
def send_notice(ctx: Any) -> dict[str, Any]:
    """Email the buyer, then wait for the mail relay to confirm. No lookup: check the outbox for the run id."""
    sent = systems().email.send(to="buyer@skew", subject=f"{ctx.run_id}:notice", body="your order is on its way")
    testing.reached("after_effect", "send_notice")
    release = Path(ctx.input["release_file"])
    deadline = time.monotonic() + float(ctx.input.get("hold_max", 60))
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return sent


# (b) A resolvable step whose far system's lookup lags (FAR_CREDIT_LOOKUP_LAG, 10 s in the test): "not found" is
# worth nothing until the lag has passed since the last moment the attempt could have made the call.
lagging_credit = Workflow("lagging_credit")


def find_credit_check(ctx: Any) -> dict[str, Any] | None:
    return LaggingCredit().lookup(ctx.effect_key)


@lagging_credit.step(policy="resolvable", lookup=find_credit_check, lookup_lag=timedelta(seconds=10),
                     timeout=timedelta(seconds=1))
def check_credit(ctx: Any) -> dict[str, Any]:
    result = LaggingCredit().check(request_id=ctx.effect_key, buyer="Harbour Foods", amount=1000)
    testing.reached("after_effect", "check_credit")
    return result


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


mapping = Workflow("mapping")


def _price(ctx: Any) -> Any:
    """The function `quote_lines` maps: one line a call, each call appended to the ledger named by the input
    (`<run_id> <attempt> <item>`) as it starts; it takes `item_seconds`; an item listed in `fail` raises on the
    first attempt."""
    spec = ctx.input

    def price(item: int) -> dict[str, Any]:
        fd = os.open(spec["ledger"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{ctx.run_id} {ctx.attempt} {item}\n".encode())
        finally:
            os.close(fd)
        time.sleep(spec.get("item_seconds", 0))
        if spec.get("touch_db"):  # a connection of this thread's own, which ctx.map closes when the thread ends
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()" if connection.vendor == "postgresql" else "SELECT 1")
                backend = cursor.fetchone()[0]
        if item in spec.get("fail", ()) and ctx.attempt == 1:
            raise Rejected(f"line {item} has no price")
        priced = {"item": item, "price": item * 3}
        if spec.get("touch_db"):
            priced["backend"] = backend
        return priced

    return price


@mapping.step(policy="re_executable", max_attempts=3)
def quote_lines(ctx: Any) -> dict[str, Any]:
    spec = ctx.input
    lines = ctx.map(_price(ctx), range(spec["lines"]), concurrency=spec.get("concurrency", 8),
                    every=spec.get("every", 25))
    if spec.get("raise_after") and ctx.attempt == 1:
        raise Rejected("the step raised after its map returned")
    return {"lines": lines}


ticked = Workflow("ticked")


@ticked.step(policy="re_executable")
def tick(ctx: Any) -> dict[str, Any]:
    """A scheduled run's one step: appends its run_id to TIMETABLE_LEDGER (when set), one line a call."""
    ledger = os.environ.get("TIMETABLE_LEDGER")
    if ledger:
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{ctx.run_id}\n".encode())
        finally:
            os.close(fd)
    return {"run": ctx.run_id, **ctx.input}


# Runs that wait (durableruns.waits): an approval above a limit, the supplier's confirmation, a sleep, and a step
# that applies only when the confirmation says no backorder. `notify_buyer` emails (a counted effect), so a
# doubled step shows.
waiting = Workflow("waiting")


@waiting.step(policy="re_executable")
def quote(ctx: Any) -> dict[str, Any]:
    return {"total": ctx.input.get("total", 0)}


waiting.approval("manager_approval", when=lambda ctx: ctx.results["quote"]["total"] > 10_000,
                 timeout=_seconds("TEST_APPROVAL_TIMEOUT", 3600), on_timeout="escalate", on_reject="cancel",
                 doc="Check the quote against the budget.")
waiting.wait_for("supplier_confirmed", timeout=_seconds("TEST_WAIT_TIMEOUT", 3600), on_timeout="escalate")
waiting.sleep("cool_off", lambda ctx: timedelta(seconds=float(ctx.input.get("cool_off", 0.5))))


@waiting.step(policy="escalate", when=lambda ctx: not ctx.results["supplier_confirmed"].get("backorder"))
def notify_buyer(ctx: Any) -> dict[str, Any]:
    """Email the buyer that the supplier confirmed. No lookup: check the outbox for the run id by hand."""
    confirmed = ctx.results["supplier_confirmed"]
    sent = systems().email.send(to="buyer@waits", subject=f"{ctx.run_id}:confirmed",
                                body=f"confirmed {confirmed.get('ref', '')}")
    testing.reached("after_effect", "notify_buyer")
    return {"sent": sent["id"] if isinstance(sent, dict) and "id" in sent else True, "saw": confirmed}


# A sleep alone (the pool holds no thread for it) and a short sleep before an acting step.
sleeper = Workflow("sleeper")
sleeper.sleep("nap", lambda ctx: timedelta(seconds=float(ctx.input.get("seconds", 60))))


@sleeper.step(policy="re_executable")
def woke(ctx: Any) -> dict[str, Any]:
    return {"slept": ctx.results["nap"]}


# A wait with each timeout mode, and a when= a later deploy changes (tests/integration/test_waits.py).
def _on_timeout(mode: str) -> Workflow:
    flow = Workflow(f"waits_{mode}")
    flow.wait_for("signal", event="go", timeout=timedelta(seconds=60), on_timeout=mode)

    @flow.step(policy="re_executable")
    def after(ctx: Any) -> dict[str, Any]:
        return {"signal": ctx.results["signal"]}

    return flow


waits_fail, waits_escalate, waits_continue = (_on_timeout(m) for m in ("fail", "escalate", "continue"))


# Concurrency limits and result() (issue 23, tests/integration/test_limits.py): each step takes TEST_LIMITED_SECONDS
# (0.1 s by default), long enough that runs would overlap without their limit.
def _busy() -> dict[str, float]:
    """Take a while, and say when the step's own work began and ended (this host's clock: the test's workers share
    it), which is the interval the limit bounds: a far session held from the first moment to the last."""
    began = time.time()
    time.sleep(float(os.environ.get("TEST_LIMITED_SECONDS", 0.1)))
    return {"began": began, "ended": time.time()}


limited = Workflow("limited", concurrency=3)


@limited.step(policy="re_executable")
def limited_work(ctx: Any) -> dict[str, Any]:
    return {"n": ctx.input.get("n"), **_busy()}


keyed = Workflow("keyed", concurrency_key=lambda input: input["buyer"])


@keyed.step(policy="re_executable")
def keyed_open(ctx: Any) -> dict[str, Any]:
    return {"did": "open", **_busy()}


@keyed.step(policy="re_executable")
def keyed_close(ctx: Any) -> dict[str, Any]:
    return {"did": "close", **_busy()}


# A far session of a key limit 1 that lasts until the test opens its gate (tests/integration/test_limits_cancel.py):
# the step notes in GATED_DIR when it entered the far system and when it left it, on this host's clock (the test's
# workers share it), and waits for the file open-<run_id> meanwhile, as a far call that takes its time.
gated = Workflow("gated", concurrency_key=lambda input: input["account"])


@gated.step(policy="re_executable")
def gated_session(ctx: Any) -> dict[str, Any]:
    folder = Path(os.environ["GATED_DIR"])
    with (folder / "log").open("a") as log:
        log.write(f"{ctx.run_id} entered {time.time()!r}\n")
    gate = folder / f"open-{ctx.run_id}"
    deadline = time.monotonic() + 120
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    with (folder / "log").open("a") as log:
        log.write(f"{ctx.run_id} left {time.time()!r}\n")
    return {"account": ctx.input["account"]}


refused = Workflow("refused")


@refused.step(policy="re_executable", max_attempts=1, fails_on=FarRejected)
def refuse(ctx: Any) -> None:
    raise FarRejected("no such supplier")


# Child runs (durableruns.children): an order books each warehouse's shipment as a child run, then joins them.
# `book` is a counted effect under the child's own key (the carrier does not deduplicate), so a doubled child or a
# doubled booking shows; `confirm_booking` escalates when told its answer was lost, which holds the parent's join.
booking = Workflow("booking")


@booking.step(policy="resolvable", lookup=find_shipment, lookup_lag=LAG, timeout=TIMEOUT, fails_on=Rejected,
              max_attempts=1)
def book(ctx: Any) -> dict[str, Any]:
    if ctx.input.get("fail"):
        raise Rejected(f"no carrier serves {ctx.input.get('warehouse')}")
    result = systems().carrier.book(key=ctx.effect_key, address=str(ctx.input.get("warehouse")), parcels=1)
    testing.reached("after_effect", "book")
    return result


@booking.step(policy="escalate")
def confirm_booking(ctx: Any) -> dict[str, Any]:
    """Ask the warehouse by phone whether the booking stands."""
    if ctx.input.get("doubt") and ctx.attempt == 1:
        raise RuntimeError("the warehouse's answer was lost")
    return {"warehouse": ctx.input.get("warehouse"), "booked": ctx.results["book"]}


def _shipping(name: str, on_child_failure: str) -> Workflow:
    flow = Workflow(name)

    @flow.step(policy="re_executable", max_attempts=3)
    def book_warehouses(ctx: Any) -> dict[str, Any]:
        started = []
        for n, spec in enumerate(ctx.input["warehouses"]):
            # a Workflow or its name: both start the same child
            started.append(ctx.start_run(booking if n % 2 else "booking", spec, key=spec["warehouse"]))
            testing.reached(f"started:{n + 1}", "book_warehouses")
        if ctx.input.get("again"):  # the same key and input again: the same child, nothing started
            first = ctx.input["warehouses"][0]
            started.append(ctx.start_run("booking", first, key=first["warehouse"]))
        if ctx.input.get("raise_once") and ctx.attempt == 1:
            raise RuntimeError("the step died after starting its children")
        return {"children": started}

    flow.join("bookings", on_child_failure=on_child_failure)

    @flow.step(policy="re_executable")
    def ship_order(ctx: Any) -> dict[str, Any]:
        return {"statuses": {run_id: child["status"] for run_id, child in ctx.results["bookings"].items()}}

    return flow


shipping, shipping_continue = _shipping("shipping", "fail"), _shipping("shipping_continue", "continue")


def warehouses(*names: str, each: dict[str, dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    """A shipping run's input: one booking per warehouse, with each={"south": {"fail": True}} added to the
    named warehouses' inputs, and `extra` to the run's."""
    return {"warehouses": [{"warehouse": n, **(each or {}).get(n, {})} for n in names], **extra}


# A parent whose children are still unfinished when it ends, each way (issue 30, item 3): `end` in its input is
# "complete", "fail", "reject" (its approval rejected: on_reject="cancel"), "abandon" (its escalated step abandoned
# by staff) or "cancel" (left waiting at `hold` for a staff cancel). Each child naps, then books a counted
# shipment: a child that goes on after its parent was cancelled shows as a booking.
napping_child = Workflow("napping_child")
napping_child.sleep("nap", lambda ctx: timedelta(seconds=float(ctx.input.get("nap", 3600))))


@napping_child.step(policy="resolvable", lookup=find_shipment, lookup_lag=LAG, timeout=TIMEOUT)
def book_after_nap(ctx: Any) -> dict[str, Any]:
    return systems().carrier.book(key=ctx.effect_key, address=str(ctx.input.get("n")), parcels=1)


# A child that holds a reservation while it naps: a cancel gives it back before the child ends.
napping_holder = Workflow("napping_holder")


@napping_holder.step(policy="re_executable", release=_give_back("hold_stock"))
def hold_stock(ctx: Any) -> dict[str, Any]:
    return systems().warehouse.reserve(1, key=ctx.effect_key)


napping_holder.sleep("nap_holding", lambda ctx: timedelta(seconds=float(ctx.input.get("nap", 3600))))

guardian = Workflow("guardian")


@guardian.step(policy="re_executable")
def start_nappers(ctx: Any) -> dict[str, Any]:
    naps = ctx.input.get("naps", [3600, 3600])
    flow = napping_holder if ctx.input.get("holder") else napping_child
    return {"children": [ctx.start_run(flow, {"n": n, "nap": nap}, key=n) for n, nap in enumerate(naps)]}


guardian.approval("go_ahead", when=lambda ctx: ctx.input["end"] == "reject", on_reject="cancel")


@guardian.step(policy="escalate", when=lambda ctx: ctx.input["end"] == "abandon")
def call_the_supplier(ctx: Any) -> None:
    """Ask the supplier by phone whether the order stands."""
    raise RuntimeError("the supplier's answer was lost")


@guardian.step(policy="re_executable", max_attempts=1, fails_on=Rejected, when=lambda ctx: ctx.input["end"] == "fail")
def refuse_order(ctx: Any) -> None:
    raise Rejected("the supplier refused the order")


guardian.wait_for("hold", event="released", when=lambda ctx: ctx.input["end"] == "cancel")


@guardian.step(policy="re_executable")
def close_order(ctx: Any) -> dict[str, Any]:
    return {"closed": True}


# Rate limits (tests/integration/test_rates.py): a booking at the carrier, which does not deduplicate, so a second
# call under one run shows in its ledger; the ledger's created_at is the carrier's own clock. At most TEST_RATE
# bookings per carrier (the key) start in any window, across every worker; a lost reply is settled by lookup.
rated = Workflow("rated")


@rated.step(policy="resolvable", lookup=find_shipment, lookup_lag=timedelta(0), timeout=timedelta(seconds=1),
            rate=os.environ.get("TEST_RATE", "5/s"), rate_key=lambda ctx: ctx.input.get("carrier", "dhl"))
def book_rated(ctx: Any) -> dict[str, Any]:
    if ctx.input.get("unanswered_first") and ctx.attempt == 1:
        raise TimeoutError("the carrier did not answer")  # before the call: its lookup finds nothing
    result = systems().carrier.book(key=ctx.effect_key, address="1 Rate Street", parcels=[{"kg": 1}])
    testing.reached("after_effect", "book_rated")
    time.sleep(float(ctx.input.get("hold", 0)))
    return result


@rated.step(policy="re_executable")
def after_booking(ctx: Any) -> dict[str, Any]:
    return {"booked": ctx.results["book_rated"]["shipment_id"]}


# One bucket for the step (no rate_key), 2 a minute: a third run waits for its turn.
rated_plain = Workflow("rated_plain")


@rated_plain.step(policy="re_executable", rate="2/m")
def plain_call(ctx: Any) -> dict[str, Any]:
    return {"n": ctx.input.get("n")}


# Debounced starts (issue 35, tests/integration/test_debounce.py): a re-quote that records the input it ran with.
requote = Workflow("requote")


@requote.step(policy="re_executable")
def requote_lines(ctx: Any) -> dict[str, Any]:
    return {"edit": ctx.input.get("edit"), "order": ctx.input.get("order")}


# Results held for a later commit (issue 34, durableruns.held; tests/integration/test_held.py and the crash
# matrix): three steps that record no intent between two that act on a far system. Every call appends a line to
# input["calls"]: the step, and how many of the run's attempts the record held as it was called (what was
# committed before it acted). reserve and confirm append their effect key to input["ledger"], a far system that
# does not deduplicate: a key there twice is an effect made twice. Their lookups read it.
chained = Workflow("chained")


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # one write per line: never interleaved
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def _called(ctx: Any) -> None:
    from durableruns.models import RunStep

    _append(ctx.input["calls"], f"{ctx.step} {RunStep.objects.filter(run_id=ctx.run_id).count()}")
    time.sleep(ctx.input.get("sleep", {}).get(ctx.step, 0))


def _in_ledger(ctx: Any) -> dict[str, Any] | None:
    booked = Path(ctx.input["ledger"]).read_text().split() if Path(ctx.input["ledger"]).exists() else []
    return {"key": ctx.effect_key} if ctx.effect_key in booked else None


def _book(ctx: Any) -> dict[str, Any]:
    _called(ctx)
    _append(ctx.input["ledger"], ctx.effect_key)
    return {"key": ctx.effect_key}


def _chain_price(n: int) -> Any:
    def price(ctx: Any) -> dict[str, Any]:
        _called(ctx)
        if ctx.input.get("raise_in") == ctx.step and ctx.attempt == 1:
            raise RuntimeError("the price list is unavailable")
        if ctx.input.get("attribute_in") == ctx.step:  # recorded with its result: that commit comes at once
            ctx.set_attributes(priced_by=ctx.step)
        if ctx.input.get("take_over_in") == ctx.step:  # another worker takes the run meanwhile
            from durableruns.models import RunState

            RunState.objects.filter(pk=ctx.run_id).update(epoch=F("epoch") + 1)
        return {"total": (ctx.results[f"price_{n - 1}"]["total"] if n > 1 else 0) + n}

    price.__name__ = price.__qualname__ = f"price_{n}"
    return price


def _booker(name: str) -> Any:
    def book(ctx: Any) -> dict[str, Any]:
        return _book(ctx)

    book.__name__ = book.__qualname__ = name
    return book


chained.step(policy="resolvable", lookup=_in_ledger)(_booker("reserve"))
for _n in (1, 2, 3):
    chained.step(policy="re_executable", intent=False)(_chain_price(_n))
chained.step(policy="resolvable", lookup=_in_ledger)(_booker("confirm"))

# Only steps that record no intent: the run's last result, held with the others, ends it in one commit.
pure_chain = Workflow("pure_chain")
for _n in (1, 2, 3):
    pure_chain.step(policy="re_executable", intent=False)(_chain_price(_n))

# Held results of every JSON shape, written by the one statement that ends the run: a null, text with quotes,
# backslashes and a line separator, a nested object.
held_values = Workflow("held_values")


@held_values.step(policy="re_executable", intent=False)
def gives_null(ctx: Any) -> None:
    return None


@held_values.step(policy="re_executable", intent=False)
def gives_text(ctx: Any) -> str:
    return 'a "quoted" \\ path\u2028é'


@held_values.step(policy="re_executable", intent=False)
def gives_object(ctx: Any) -> dict[str, Any]:
    return {"n": [1, 2.5, None], "nested": {"null": None, "s": "x'y"}}


# A step that records no intent has no started attempt to checkpoint into: its ctx.loop fails the attempt, clearly.
unrecorded_loop = Workflow("unrecorded_loop")


@unrecorded_loop.step(policy="re_executable", intent=False, max_attempts=2)
def count_lines(ctx: Any) -> int:
    return sum(1 for _ in ctx.loop(range(30), every=10))
