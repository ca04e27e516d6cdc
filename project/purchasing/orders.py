"""The purchase order as orders really run: it waits for people and partners, fans out, and a night reconciles.

`purchase_order` (workflows.py) is the design source's straight line, the one the crash matrix and the soaks
kill at every point. `full_purchase_order` is what the same business does on a real day:
- the quote asks the supplier's portal for every line's price, 16 lines at a time (`ctx.map`);
- above APPROVAL_LIMIT a manager approves the order before anything is charged (`approval`);
- once placed, the order waits for the supplier's confirmation, a partner's webhook (`wait_for`, `send`);
- each warehouse the order ships from books its shipment as a run of its own (`ctx.start_run`, `join`);
- the buyer is told, unless the supplier put the order on backorder (`when=`).
Every night `nightly_reconciliation` compares the payment provider's ledger with the orders (`schedule`).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

from django.conf import settings

import durableruns
from durableruns import Rejected, Workflow, testing
from durableruns.models import RunState, RunStatus
from project.purchasing import pricing
from project.purchasing.far import FarRejected, systems
from project.purchasing.workflows import CALL_TIMEOUT, by_key, charge, place_order

APPROVAL_LIMIT = 100_000  # cents: orders above 1,000.00 EUR wait for a manager
WAREHOUSES = ("Rotterdam", "Hamburg", "Antwerp")
PRICE_CALL_SECONDS = float(os.environ.get("PURCHASING_PRICE_CALL_SECONDS", 0.02))  # one portal price lookup

full_purchase_order = Workflow("full_purchase_order")
shipment = Workflow("shipment")
reconciliation = Workflow("reconciliation")


@full_purchase_order.step(policy="re_executable")
def parse_request(ctx: Any) -> dict[str, Any]:
    """Validate the request, expand its lines and say which warehouse ships each (round robin over the
    warehouses the request names)."""
    order = pricing.parse(dict(ctx.input))
    warehouses = ctx.input.get("warehouses", [WAREHOUSES[0]])
    if not isinstance(warehouses, list) or not warehouses or not all(w in WAREHOUSES for w in warehouses):
        raise Rejected(f"warehouses must be a non-empty list of {', '.join(WAREHOUSES)}")
    for n, line in enumerate(order["lines"]):
        line["warehouse"] = warehouses[n % len(warehouses)]
    return order


def price_line(line: dict[str, Any]) -> int:
    """One call to the supplier portal's price list (a read: safe to ask again)."""
    time.sleep(PRICE_CALL_SECONDS)
    return pricing.price_of(line)


@full_purchase_order.step(policy="re_executable")
def quote(ctx: Any) -> dict[str, Any]:
    """Price every line, 16 calls at a time; finished prices are checkpointed every 25, so a resume asks the
    portal only for the lines not yet priced."""
    prices = ctx.map(price_line, ctx.results["parse_request"]["lines"], concurrency=16, every=25)
    return {"total": sum(prices), "lines": len(prices)}


full_purchase_order.approval(
    "manager_approval",
    when=lambda ctx: ctx.results["quote"]["total"] > APPROVAL_LIMIT,
    timeout=timedelta(days=2),
    on_timeout="escalate",
    on_reject="cancel",
    doc="Orders above 1,000.00 EUR: check the quote's total against the department's budget before the buyer "
    "is charged.",
)


# Charging and placing the order are the straight line's own steps, declared here again under the same policies.
full_purchase_order.step(
    policy="resolvable", lookup=by_key("payments", "lookup"), timeout=CALL_TIMEOUT, fails_on=FarRejected
)(charge)
full_purchase_order.step(
    policy="resolvable", lookup=by_key("portal", "get_by_key"), timeout=CALL_TIMEOUT, fails_on=FarRejected
)(place_order)

full_purchase_order.wait_for("supplier_confirmed", timeout=timedelta(days=2), on_timeout="escalate")


@full_purchase_order.step(policy="re_executable")
def book_shipments(ctx: Any) -> dict[str, Any]:
    """Start one shipment run per warehouse. A child's run_id comes from this run, this step and the
    warehouse, so this step run again after a crash starts no second shipment."""
    lines_by_warehouse: dict[str, int] = {}
    for line in ctx.results["parse_request"]["lines"]:
        lines_by_warehouse[line["warehouse"]] = lines_by_warehouse.get(line["warehouse"], 0) + 1
    order = ctx.results["parse_request"]
    started = {
        warehouse: ctx.start_run(
            shipment,
            {"reference": order["reference"], "address": order["address"], "warehouse": warehouse, "lines": lines},
            key=warehouse,
        )
        for warehouse, lines in sorted(lines_by_warehouse.items())
    }
    return {"shipments": started}


full_purchase_order.join("shipments_booked", on_child_failure="fail")


@full_purchase_order.step(
    policy="escalate",
    fails_on=FarRejected,
    when=lambda ctx: not (ctx.results["supplier_confirmed"] or {}).get("backorder", False),
)
def notify_buyer(ctx: Any) -> dict[str, Any]:
    """Email the buyer that the order shipped (not for a backorder: the supplier tells the buyer then). The
    email sender keeps no key and has no lookup: check its outbox for a message whose subject names the
    order's reference; if it is there, it happened."""
    order = ctx.results["parse_request"]
    booked = [child["results"]["book"]["shipment_id"] for child in ctx.results["shipments_booked"].values()]
    result = systems().email.send(
        to=order["email"],
        subject=f"{order['reference']} has shipped",
        body=f"Shipments {', '.join(sorted(booked))} are on their way.",
    )
    testing.reached("after_effect", "notify_buyer")
    return result


@shipment.step(policy="resolvable", lookup=by_key("carrier", "lookup"), timeout=CALL_TIMEOUT, fails_on=FarRejected)
def book(ctx: Any) -> dict[str, Any]:
    """Book the carrier from one warehouse under this shipment run's own key."""
    result = systems().carrier.book(
        key=ctx.effect_key,
        address=ctx.input["address"],
        parcels=[{"from": ctx.input["warehouse"], "lines": ctx.input["lines"]}],
    )
    testing.reached("after_effect", "book")
    return result


@reconciliation.step(policy="re_executable")
def compare_ledgers(ctx: Any) -> dict[str, Any]:
    """Compare the payment provider's charges with the purchase orders that charged: a charge no run recorded
    (or a run's charge the provider does not have) is a mismatch for the accounts team. Reads only."""
    charged = {key.rsplit(":", 1)[0] for key in systems().payments.counts_by_key() if key.endswith(":charge")}
    runs = set(
        RunState.objects.filter(
            workflow__in=("purchase_order", "full_purchase_order"),
            attempts__step="charge",
            attempts__status="completed",
        ).values_list("run_id", flat=True)
    )
    return {
        "charges": len(charged),
        "runs_that_charged": len(runs),
        "not_recorded": sorted(charged - runs)[:20],
        "not_at_provider": sorted(runs - charged)[:20],
        "orders_in_flight": RunState.objects.filter(
            workflow="full_purchase_order", status__in=(RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING)
        ).count(),
    }


RECONCILIATION_CRON: str = getattr(settings, "PURCHASING_RECONCILIATION_CRON", "0 2 * * *")
if RECONCILIATION_CRON:
    durableruns.schedule(
        "nightly_reconciliation", reconciliation, RECONCILIATION_CRON, timezone="Europe/Amsterdam", catch_up="latest"
    )
