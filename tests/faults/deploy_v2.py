"""Deploy v2 of purchase_order: a `confirm_budget` step inserted before `charge`, so the plan's fingerprint changes.

Loaded only by worker subprocesses (DURABLERUNS_WORKFLOW_MODULES): it replaces purchase_order in the registry.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from durableruns.policies import Policy
from durableruns.registry import Step
from tests.faults.deploys import copy_of


def confirm_budget(ctx: Any) -> dict[str, Any]:
    """Confirm the buyer's budget (the new step of deploy v2)."""
    return {"confirmed": len(ctx.results["parse_request"]["lines"])}


def find_confirmation(ctx: Any) -> dict[str, Any] | None:
    return None


copy_of("purchase_order", insert_before=("charge", Step(
    name="confirm_budget", fn=confirm_budget, policy=Policy.RESOLVABLE, lookup=find_confirmation,
    timeout=timedelta(seconds=1),
)))
