"""Workflows with attributes (durableruns.attributes), for the attribute tests: integration, API and admin."""

from __future__ import annotations

from typing import Any

from durableruns import Workflow

attributed = Workflow(
    "attributed_order",
    attributes={
        "po": "po_number",
        "buyer": lambda input: input["buyer"]["name"],
        "lines": lambda input: len(input.get("lines", [])),
    },
)


@attributed.step(policy="re_executable", max_attempts=2)
def invoice(ctx: Any) -> dict[str, Any]:
    """Set the invoice attribute; the input says whether to raise after setting it, or set a bad value."""
    mode = ctx.input.get("mode", "")
    if mode == "bad_value":
        ctx.set_attributes(invoice=3.5)
    ctx.set_attributes(invoice=f"INV-{ctx.attempt}", amount=120)
    if mode == "raise_after_set" or (mode == "raise_once" and ctx.attempt == 1):
        raise RuntimeError("the printer jammed after the attributes were set")
    return {"invoice": f"INV-{ctx.attempt}"}


@attributed.step(policy="re_executable")
def ship(ctx: Any) -> dict[str, Any]:
    """Replace the amount, add the carrier: the run then has both steps' attributes, the later one winning."""
    ctx.set_attributes(amount=99, carrier="DHL")
    if ctx.input.get("children"):
        for n in range(ctx.input["children"]):
            ctx.start_run(
                "attributed_order", {"po_number": f"{ctx.input['po_number']}-{n}", "buyer": ctx.input["buyer"]}, key=n
            )
    return {"shipped": True}


@attributed.step(policy="resolvable", lookup=lambda ctx: None)
def notify(ctx: Any) -> dict[str, Any]:
    """A resolvable step: its child runs are started in commits of their own (store.start_child)."""
    if ctx.input.get("resolvable_child"):
        ctx.start_run(
            "attributed_order", {"po_number": f"{ctx.input['po_number']}-r", "buyer": ctx.input["buyer"]}, key="r"
        )
    return {"notified": True}


def order_input(po: str = "PO-2026-0041", buyer: str = "Acme BV", **more: Any) -> dict[str, Any]:
    return {"po_number": po, "buyer": {"name": buyer}, "lines": [1, 2, 3], **more}
