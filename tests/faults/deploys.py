"""Other deploys of the purchase order, for the bad-input tests: built from the real steps of project/purchasing.

`copy_of` declares a workflow with purchase_order's steps (same functions, same policies), optionally with some
functions replaced or a step inserted. Importing this module registers only `purchase_order_2025`, last year's
name of the flow, which the current deploy no longer has: safe in the test process. The modules that replace
`purchase_order` itself (deploy_v2, deploy_buggy) are loaded only by worker subprocesses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durableruns import Workflow
from durableruns.registry import Step
from project.purchasing import workflows as po


def declare(workflow: Workflow, step: Step, fn: Callable[[Any], Any]) -> None:
    release = step.releaser
    workflow.step(policy=step.policy, lookup=step.lookup, lookup_lag=step.lookup_lag, timeout=step.timeout,
                  max_attempts=step.max_attempts, fails_on=step.fails_on, intent=step.intent,
                  release=release.fn if release else None, release_lookup=release.lookup if release else None,
                  hold_expires_after=step.hold_expires_after, released_by=step.released_by)(fn)


def copy_of(name: str, *, replace: dict[str, Callable[[Any], Any]] | None = None,
            insert_before: tuple[str, Step] | None = None) -> Workflow:
    """A workflow named `name` with purchase_order's plan; `replace` swaps step functions (same names).

    Declared with Workflow(replace=True): deploy_v2 and deploy_buggy mean to replace purchase_order, which
    project.purchasing.workflows declares, in the worker processes that load them."""
    workflow = Workflow(name, replace=True)
    for step in po.purchase_order.steps:
        if insert_before and insert_before[0] == step.name:
            declare(workflow, insert_before[1], insert_before[1].fn)
        declare(workflow, step, (replace or {}).get(step.name, step.fn))
    return workflow


purchase_order_2025 = copy_of("purchase_order_2025")
