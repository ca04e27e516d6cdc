"""Workflows of the inbox's tests (durableruns.inbox), in process and in worker subprocesses (started with
DURABLERUNS_WORKFLOW_MODULES naming this module too). TEST_INBOX_DUE_SECONDS shrinks how long an item has."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from durableruns import Workflow

DUE = timedelta(seconds=float(os.environ.get("TEST_INBOX_DUE_SECONDS", 3600)))
MANAGERS = "Purchasing managers"
DIRECTORS = "Finance directors"

inbox_order = Workflow("inbox_order", attributes={"desk": "desk"})


@inbox_order.step(policy="re_executable")
def price(ctx: Any) -> dict[str, Any]:
    return {"total": ctx.input.get("total", 100)}


inbox_order.approval(
    "manager_approval", assign_to=MANAGERS, due=DUE, escalate_to=DIRECTORS, doc="Check the quote against the budget."
)


@inbox_order.step(policy="escalate", assign_to=lambda ctx: ctx.input["desk"], due=DUE)
def notify_buyer(ctx: Any) -> dict[str, Any]:
    """Mail the buyer. How to check by hand: look for the mail in the buyer's sent folder."""
    return {"sent": True}


# A workflow of the payroll (scoped to the group Payroll by the tests that need it): an approval for everyone.
inbox_payroll = Workflow("inbox_payroll")


@inbox_payroll.step(policy="re_executable")
def compute(ctx: Any) -> dict[str, Any]:
    return {"net": 1}


inbox_payroll.approval("payroll_approval", due=DUE)
