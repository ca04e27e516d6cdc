"""The demo's second act: purchase orders as they really run (project/purchasing/orders.py).

Two orders go through a `resume_runs --loop` worker: the quote's 240 portal calls 16 at a time, a manager's
approval above the limit (skipped below it), the supplier's confirmation arriving a few seconds later as a
partner's webhook (through the API, with a token; sent twice, recorded once), one shipment run per warehouse
joined by the order, and the buyer told unless the order is on backorder. The worker is SIGKILLed while the
orders wait: a waiting run holds nothing, so the next worker goes on at once. Then the nightly reconciliation
schedule, as the workers left it in the record.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token

import durableruns
from durableruns import schedules, services
from durableruns.models import RunState, RunStatus, RunStep, ScheduleState
from project.purchasing import orders

if TYPE_CHECKING:
    from project.purchasing.demo import Demo

BIG = "PO-2026-0101"
SMALL = "PO-2026-0102"
SUPPLIER_DELAY = 3.0  # seconds before the supplier's system confirms the orders
WEBHOOK_USER = "supplier-webhooks"


class ActError(Exception):
    """Something the second act relies on did not happen."""


class OrdersAct:
    """One showing of the second act on the Demo's far systems, workers and output."""

    def __init__(self, demo: Demo) -> None:
        self.demo = demo
        self.say = demo.say
        self.tz = demo.tz
        self.ids = (BIG, SMALL)

    def play(self, number: int) -> None:
        self.say(f"{number}. Orders as they really run: full_purchase_order (project/purchasing/orders.py) waits for a")
        self.say("   manager above 1,000.00 EUR, waits for the supplier's confirmation (a webhook), books one shipment")
        self.say("   run per warehouse and joins them. Steps:")
        plan = durableruns.registry.get_workflow("full_purchase_order").plan
        self.say(f"   {' -> '.join(plan[:5])} ->")
        self.say(f"   {' -> '.join(plan[5:])}.")
        self.reset()
        first = self.loop_worker("loop-1")
        try:
            self.until(
                lambda: self.waiting_at(BIG, "manager_approval") and self.waiting_at(SMALL, "supplier_confirmed"),
                "both orders waiting",
            )
            self.show_quote()
            self.show_waiting("   Both orders wait now; what the record says:")
        finally:
            first.send_signal(signal.SIGKILL)
            first.communicate(timeout=60)
        held = RunState.objects.filter(pk__in=self.ids, lease_expires_at__isnull=False).count()
        self.say(f"   The worker is SIGKILLed while they wait. Leases they held: {held}. Nothing to run out before")
        self.say("   another worker may go on, and no thread was parked on them.")
        if held:
            raise ActError(f"{held} waiting order(s) held a lease")
        second = self.loop_worker("loop-2")
        try:
            self.approve()
            self.until(lambda: self.waiting_at(BIG, "supplier_confirmed"), f"{BIG} waiting for the supplier")
            self.show_pickup()
            self.webhooks()
            self.until(lambda: self.ended(), "both orders completed")
        finally:
            second.send_signal(signal.SIGTERM)
            try:
                second.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                second.kill()
        self.show_ended()
        self.show_schedule()

    # -- the parts -------------------------------------------------------------------------------------------

    def reset(self) -> None:
        gone = RunState.objects.filter(workflow__in=("full_purchase_order", "shipment")).delete()[1]
        for kind in ("durableruns.RunState",):
            if gone.get(kind):
                self.say(f"   (removed {gone[kind]} run(s) of an earlier demo)")
        durableruns.start(
            "full_purchase_order",
            {"reference": BIG, "buyer": "Harbour Foods", "line_count": 240, "warehouses": list(orders.WAREHOUSES)},
            run_id=BIG,
        )
        durableruns.start(
            "full_purchase_order",
            {"reference": SMALL, "buyer": "Quay Bakery", "line_count": 20, "warehouses": ["Hamburg"]},
            run_id=SMALL,
        )
        self.say(f"   Started {BIG} (240 lines, shipped from {', '.join(orders.WAREHOUSES)}) and {SMALL} (20 lines,")
        self.say("   from Hamburg), and one worker: manage.py resume_runs --loop --concurrency 4.")

    def show_quote(self) -> None:
        quote = RunStep.objects.get(run_id=BIG, step="quote", status="completed")
        assert quote.finished_at is not None
        took = (quote.finished_at - quote.started_at).total_seconds()
        serial = 240 * orders.PRICE_CALL_SECONDS
        self.say(
            f"   {BIG}'s quote: 240 portal calls of {orders.PRICE_CALL_SECONDS * 1000:.0f} ms, 16 at a time "
            f"(ctx.map), took {took:.2f} s;"
        )
        self.say(f"   one after another they would take {serial:.1f} s.")
        total = (quote.result or {})["total"]
        small = (RunStep.objects.get(run_id=SMALL, step="quote", status="completed").result or {})["total"]
        skipped = RunStep.objects.get(run_id=SMALL, step="manager_approval")
        if skipped.resolution != "skipped":
            raise ActError(f"{SMALL}'s approval was {skipped.resolution}, not skipped")
        self.say(
            f"   Totals: {BIG} {total / 100:,.2f} EUR, above the limit; {SMALL} {small / 100:,.2f} EUR: its approval"
        )
        self.say("   is recorded as skipped (when= asked once, its answer kept), so it went on to charge and order.")

    def show_waiting(self, title: str) -> None:
        self.say(title)
        for run_id in self.ids:
            run = RunState.objects.get(pk=run_id)
            self.say(f"   {run_id}  {run.status:<8} {services.run_boundary(run_id).sentence(self.tz)}")

    def approve(self) -> None:
        user = self.staff("manager", "decide_approval")
        durableruns.decide(BIG, "manager_approval", "approve", by=user, note="within the quarter's budget")
        self.say(f"   A manager (permission durableruns.decide_approval) approves {BIG}, as in the admin's")
        self.say("   approval queue; a new worker, loop-2, is running.")

    def show_pickup(self) -> None:
        approval = RunStep.objects.get(run_id=BIG, step="manager_approval", status="completed")
        charge = RunStep.objects.get(run_id=BIG, step="charge")
        gap = (charge.started_at - datetime.fromisoformat((approval.result or {})["at"])).total_seconds()
        self.say(f"   {BIG} is charged and ordered: the charge's intent was recorded {gap:.2f} s after the decision")
        self.say("   (on SQLite the idle worker looks every 0.5 s; on PostgreSQL a NOTIFY wakes it at once).")

    def webhooks(self) -> None:
        self.say(f"   {SUPPLIER_DELAY:.0f} s later the supplier's system confirms both orders, as its webhook would:")
        self.say(f"   POST /api/runs/<run>/events/ with the token of the relay's user {WEBHOOK_USER} (permission")
        self.say("   durableruns.send_event):")
        time.sleep(SUPPLIER_DELAY)
        token, _ = Token.objects.get_or_create(user=self.staff(WEBHOOK_USER, "send_event", staff=False))
        client = Client(HTTP_AUTHORIZATION=f"Token {token.key}")
        sends = [
            (BIG, {"confirmation": "SUP-88121", "backorder": False}, "sup-msg-88121"),
            (BIG, {"confirmation": "SUP-88121", "backorder": False}, "sup-msg-88121"),  # the partner retries
            (SMALL, {"confirmation": "SUP-88122", "backorder": True}, "sup-msg-88122"),
        ]
        codes = []
        for run_id, payload, key in sends:
            response = client.post(
                f"/api/runs/{run_id}/events/",
                {"event": "supplier_confirmed", "payload": payload, "key": key},
                content_type="application/json",
            )
            codes.append(response.status_code)
            meaning = {201: "recorded", 200: "a retry: this key is recorded already, nothing changes"}
            self.say(
                f"     {run_id} key {key} {payload}: {response.status_code} "
                f"{meaning.get(response.status_code, response.content.decode()[:200])}"
            )
        if codes != [201, 200, 201]:
            raise ActError(f"the webhooks got {codes}, not [201, 200, 201]")

    def show_ended(self) -> None:
        self.say("   Where they ended:")
        for run_id in self.ids:
            run = RunState.objects.get(pk=run_id)
            self.say(f"   {run_id}  {run.status:<9} {services.run_boundary(run_id).sentence(self.tz)}")
        children = list(RunState.objects.filter(parent_id=BIG).order_by("run_id").values_list("run_id", "status"))
        self.say(f"   {BIG}'s shipment runs (child runs, shown with their parent in the admin and the API):")
        for child, status in children:
            self.say(f"     {child}  {status}")
        consumed = RunStep.objects.filter(run_id__in=self.ids, step="supplier_confirmed", status="completed").count()
        notified = RunStep.objects.get(run_id=SMALL, step="notify_buyer")
        self.say(f"   Events consumed: {consumed} (the retried webhook was recorded once); {SMALL} is on backorder,")
        self.say(f"   so its notify_buyer is {notified.resolution} (when= said no), as the supplier tells the buyer.")
        far = self.demo.far
        bookings = {k: n for k, n in far.carrier.counts_by_key().items() if k.startswith(f"{BIG}/")}
        charges = {k: n for k, n in far.payments.counts_by_key().items() if k.split(":")[0] in self.ids}
        self.say(
            f"   The carrier's ledger: {sum(bookings.values())} bookings under {len(bookings)} keys; the payment "
            f"provider: {sum(charges.values())} charges under {len(charges)} keys."
        )
        statuses = dict(RunState.objects.filter(pk__in=self.ids).values_list("run_id", "status"))
        if (
            statuses != {BIG: RunStatus.COMPLETED, SMALL: RunStatus.COMPLETED}
            or len(children) != len(orders.WAREHOUSES)
            or any(status != RunStatus.COMPLETED for _, status in children)
            or consumed != 2
            or notified.resolution != "skipped"
            or sorted(bookings.values()) != [1] * len(orders.WAREHOUSES)
            or sorted(charges.values()) != [1, 1]
        ):
            raise ActError(
                f"the orders ended {statuses}, children {children}, bookings {bookings}, "
                f"charges {charges}, events consumed {consumed}"
            )
        self.say("")

    def show_schedule(self) -> None:
        declared = schedules.get_schedule("nightly_reconciliation")
        if declared is None:
            self.say("   (PURCHASING_RECONCILIATION_CRON is empty: no nightly reconciliation is declared)")
            return
        seen = ScheduleState.objects.filter(name=declared.name).first()
        if seen is None:
            raise ActError("no worker recorded the nightly_reconciliation schedule")
        slot = declared.next_slot(timezone.now())
        self.say(
            f"   And every night: schedule nightly_reconciliation ({declared.cron!r} in {declared.timezone}), first"
        )
        self.say(
            f"   seen by a worker at {seen.created_at.astimezone(self.tz):%H:%M:%S}. Its next slot is "
            f"{slot.astimezone(declared.zone):%Y-%m-%d %H:%M} {declared.timezone}: that run's id will be"
        )
        self.say(f"   {declared.run_id(slot)}, which the database takes once, however many workers and cron hosts")
        self.say("   are running. The admin lists it under Schedules, with its next and last slot.")
        self.say("")

    # -- helpers ---------------------------------------------------------------------------------------------

    def loop_worker(self, name: str) -> subprocess.Popen[str]:
        """A `resume_runs --loop` worker, returned once it says it is working."""
        proc = self.demo.worker("--loop", "--interval", "0.5", "--concurrency", "4", "--lease", "2", "--worker", name)
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if "working" not in first:
            proc.kill()
            raise ActError(f"worker {name} did not start: {first}{proc.communicate(timeout=60)[1]}")
        return proc

    def staff(self, username: str, codename: str, *, staff: bool = True) -> Any:
        user, _ = get_user_model().objects.get_or_create(username=username, defaults={"is_staff": staff})
        user.user_permissions.add(Permission.objects.get(content_type__app_label="durableruns", codename=codename))
        return user

    def waiting_at(self, run_id: str, step: str) -> bool:
        run = RunState.objects.get(pk=run_id)
        return run.status == RunStatus.WAITING and step in services.run_boundary(run_id).waiting

    def ended(self) -> bool:
        return (
            not RunState.objects.filter(pk__in=self.ids)
            .exclude(status__in=(RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.NEEDS_DECISION))
            .exists()
        )

    def until(self, done: Callable[[], bool], what: str, *, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                states = {r: services.run_boundary(r).sentence(self.tz) for r in self.ids}
                raise ActError(f"{what}: not within {timeout:.0f} s; {states}")
            time.sleep(0.05)
