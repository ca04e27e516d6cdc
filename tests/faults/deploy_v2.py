"""Deploy v2 of purchase_order: a `reserve_stock` step inserted before `charge`, so the plan's fingerprint changes.

Loaded only by worker subprocesses (DURABLERUNS_WORKFLOW_MODULES): it replaces purchase_order in the registry.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from durableruns.policies import Policy
from durableruns.registry import Step
from tests.faults.deploys import copy_of


def reserve_stock(ctx: Any) -> dict[str, Any]:
    """Reserve the lines at the warehouse (the new step of deploy v2)."""
    return {"reserved": len(ctx.results["parse_request"]["lines"])}


def find_reservation(ctx: Any) -> dict[str, Any] | None:
    return None


copy_of("purchase_order", insert_before=("charge", Step(
    name="reserve_stock", fn=reserve_stock, policy=Policy.RESOLVABLE, lookup=find_reservation,
    timeout=timedelta(seconds=1),
)))
