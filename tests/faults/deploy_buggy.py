"""A buggy deploy of purchase_order: the step named by FAULTS_BUGGY_STEP returns a Decimal, which is not JSON.

The plan (names and policies) is unchanged, so runs resume under it. Loaded only by worker subprocesses.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from project.purchasing import workflows as po
from tests.faults.deploys import copy_of


def in_euros(fn: Callable[[Any], dict[str, Any]], field: str) -> Callable[[Any], dict[str, Any]]:
    """The bug: the step converts cents to a Decimal of euros in its result."""

    @functools.wraps(fn)
    def step(ctx: Any) -> dict[str, Any]:
        result = dict(fn(ctx))
        result[field] = Decimal(result[field]) / 100
        return result

    return step


BUGS = {"quote": in_euros(po.quote, "total"), "charge": in_euros(po.charge, "amount")}
buggy = os.environ.get("FAULTS_BUGGY_STEP", "")
copy_of("purchase_order", replace={buggy: BUGS[buggy]} if buggy else {})
