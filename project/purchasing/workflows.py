"""The purchase order of the design source, declared for durableruns.

Each policy is a claim about a far system: the portal, the payment provider and the carrier can be asked
about an effect by our own key (resolvable); the credit vendor can too, but its lookup lags a minute, so
"not found" is trusted only after that; the email sender has no key and no lookup, so a person decides.
The warehouse's stock reservation is an acquisition: held while the run goes on (and while it waits for a
person), kept when the order completes, given back when the run ends unfinished.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from durableruns import Rejected, Workflow, testing
from project.purchasing import pricing
from project.purchasing.far import FarRejected, config_from_env, systems

_config = config_from_env()
CALL_TIMEOUT = timedelta(seconds=float(os.environ.get("PURCHASING_CALL_TIMEOUT", 30)))
QUOTE_ITEM_SECONDS = float(os.environ.get("PURCHASING_QUOTE_ITEM_SECONDS", 0))

purchase_order = Workflow("purchase_order")


def by_key(system: str, method: str) -> Callable[[Any], dict[str, Any] | None]:
    """A lookup that asks `system` for the effect by the step's own key: never a search."""

    def lookup(ctx: Any) -> dict[str, Any] | None:
        found: dict[str, Any] | None = getattr(getattr(systems(), system), method)(ctx.effect_key)
        return found

    lookup.__name__ = f"{system}.{method}"
    return lookup


@purchase_order.step(policy="re_executable")
def parse_request(ctx: Any) -> dict[str, Any]:
    """Validate the request and expand its lines. Reads nothing outside the run."""
    return pricing.parse(dict(ctx.input))


@purchase_order.step(policy="re_executable")
def quote(ctx: Any) -> dict[str, Any]:
    """Price every line; the loop is checkpointed every 25 lines, so a crash redoes at most 25."""
    prices = ctx.progress.setdefault("prices", [])
    for line in ctx.loop(ctx.results["parse_request"]["lines"], every=25):
        prices.append(pricing.price_of(line))
        if QUOTE_ITEM_SECONDS:
            time.sleep(QUOTE_ITEM_SECONDS)  # a supplier price lookup
    return {"total": sum(prices), "lines": len(prices)}


@purchase_order.step(
    policy="resolvable",
    lookup=by_key("credit", "lookup"),
    lookup_lag=timedelta(seconds=_config.credit.lookup_lag),
    timeout=CALL_TIMEOUT,
    fails_on=FarRejected,
)
def credit_check(ctx: Any) -> dict[str, Any]:
    """Ask the credit vendor under our request id (the effect key); its lookup by that id lags."""
    order = ctx.results["parse_request"]
    result = systems().credit.check(
        request_id=ctx.effect_key, buyer=order["buyer"], amount=ctx.results["quote"]["total"]
    )
    testing.reached("after_effect", "credit_check")
    if not result["approved"]:
        raise Rejected(f"credit refused for {order['buyer']}: limit {result['limit']}")
    return result


def release_reservation(ctx: Any) -> dict[str, Any]:
    """Give the stock back under the release's own key (ctx.results["reserve_stock"]: what the reservation
    recorded); a repeat under that key releases nothing more."""
    result = systems().warehouse.release(ctx.results["reserve_stock"]["reservation_id"], key=ctx.effect_key)
    testing.reached("after_effect", ctx.step)
    return result


@purchase_order.step(
    policy="resolvable",
    lookup=by_key("warehouse", "find_reservation"),
    release=release_reservation,
    hold_expires_after=timedelta(hours=4),
    timeout=CALL_TIMEOUT,
    fails_on=FarRejected,
)
def reserve_stock(ctx: Any) -> dict[str, Any]:
    """Set the order's stock aside at the warehouse under our key; the warehouse keeps it four hours on its own."""
    result = systems().warehouse.reserve(ctx.results["quote"]["lines"], key=ctx.effect_key)
    testing.reached("after_effect", "reserve_stock")
    return result


@purchase_order.step(
    policy="resolvable", lookup=by_key("payments", "lookup"), timeout=CALL_TIMEOUT, fails_on=FarRejected
)
def charge(ctx: Any) -> dict[str, Any]:
    """Charge the buyer under an idempotency key; the provider can be asked for the charge by that key."""
    result = systems().payments.charge(
        amount=ctx.results["quote"]["total"], currency="EUR", idempotency_key=ctx.effect_key
    )
    testing.reached("after_effect", "charge")
    return result


@purchase_order.step(
    policy="resolvable", lookup=by_key("portal", "get_by_key"), timeout=CALL_TIMEOUT, fails_on=FarRejected
)
def place_order(ctx: Any) -> dict[str, Any]:
    """Submit the order to the supplier portal under our key. Never ask its lagging search whether it exists."""
    order = ctx.results["parse_request"]
    result = systems().portal.submit_order(key=ctx.effect_key, reference=order["reference"], lines=order["lines"])
    testing.reached("after_effect", "place_order")
    return result


@purchase_order.step(
    policy="resolvable", lookup=by_key("carrier", "lookup"), timeout=CALL_TIMEOUT, fails_on=FarRejected
)
def book_shipment(ctx: Any) -> dict[str, Any]:
    """Book the shipment with the carrier under our key; the carrier looks bookings up by that key."""
    order = ctx.results["parse_request"]
    result = systems().carrier.book(key=ctx.effect_key, address=order["address"], parcels=1)
    testing.reached("after_effect", "book_shipment")
    return result


@purchase_order.step(policy="escalate", fails_on=FarRejected)
def notify_buyer(ctx: Any) -> dict[str, Any]:
    """Email the buyer that the order shipped. The email sender keeps no key and has no lookup: check the
    sender's outbox for a message to the buyer whose subject names this order's reference; if it is
    there, it happened; if not, run it again."""
    order = ctx.results["parse_request"]
    result = systems().email.send(
        to=order["email"],
        subject=f"{order['reference']} has shipped",
        body=f"Shipment {ctx.results['book_shipment']['shipment_id']} is on its way.",
    )
    testing.reached("after_effect", "notify_buyer")
    return result
