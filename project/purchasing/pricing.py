"""Turning a purchase request into order lines and prices: plain computation, no far system."""

from __future__ import annotations

import hashlib
from typing import Any

from durableruns import Rejected


def parse(request: dict[str, Any]) -> dict[str, Any]:
    """Validate a purchase request; a request that can never be valid is rejected, not retried forever."""
    reference = request.get("reference")
    buyer = request.get("buyer")
    if not isinstance(reference, str) or not reference:
        raise Rejected("the request has no reference (e.g. PO-2026-0041)")
    if not isinstance(buyer, str) or not buyer:
        raise Rejected("the request names no buyer")
    lines = request.get("lines")
    if lines is None:
        count = request.get("line_count", 240)
        if not isinstance(count, int) or not 1 <= count <= 10_000:
            raise Rejected(f"line_count must be an integer from 1 to 10000, not {count!r}")
        lines = [{"sku": f"SKU-{n:05d}", "qty": 1 + n % 4} for n in range(count)]
    if not isinstance(lines, list) or not all(isinstance(x, dict) and "sku" in x for x in lines):
        raise Rejected("lines must be a list of objects with a sku")
    return {
        "reference": reference,
        "buyer": buyer,
        "address": request.get("address", "1 Quay Street"),
        "email": request.get("email", f"{buyer.lower().replace(' ', '.')}@example.com"),
        "lines": lines,
    }


def price_of(line: dict[str, Any]) -> int:
    """The supplier's price of one line in cents: deterministic, so a re-run quotes the same total."""
    unit = 100 + int(hashlib.sha256(str(line["sku"]).encode()).hexdigest()[:4], 16) % 900
    return unit * int(line.get("qty", 1))
