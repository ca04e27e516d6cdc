"""Workflows with deadlines (tests/integration/test_deadline.py), in-process and in worker subprocesses (started
with DURABLERUNS_WORKFLOW_MODULES naming this module too). TEST_DEADLINE_SECONDS shrinks the deadline; a long
step waits in DEADLINE_DIR for a file that lets it return, saying when it entered and left."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from durableruns import Workflow
from project.purchasing.far import systems

DEADLINE = timedelta(seconds=float(os.environ.get("TEST_DEADLINE_SECONDS", 1800)))


def _mark(ctx: Any, what: str) -> Path:
    folder = Path(os.environ.get("DEADLINE_DIR", "/tmp"))
    marker = folder / f"{what}-{ctx.run_id}"
    marker.touch()
    return folder


def long_step(ctx: Any) -> dict[str, Any]:
    """Enter, then wait (up to 30 s) for the test to let the step return."""
    folder = _mark(ctx, "entered")
    ends = time.monotonic() + 30
    while time.monotonic() < ends and not (folder / f"open-{ctx.run_id}").exists():
        time.sleep(0.05)
    _mark(ctx, "left")
    return {"returned": True}


def after_long(ctx: Any) -> dict[str, Any]:
    _mark(ctx, "after")
    return {"after": True}


def _long_flow(name: str, on_deadline: str) -> Workflow:
    flow = Workflow(name, deadline=DEADLINE, on_deadline=on_deadline)
    flow.step(policy="re_executable")(long_step)
    flow.step(policy="re_executable")(after_long)
    return flow


deadline_long = _long_flow("deadline_long", "cancel")
deadline_long_fail = _long_flow("deadline_long_fail", "fail")

# A wait for an event with no timeout: it has no wake time but its deadline.
deadline_event = Workflow("deadline_event", deadline=DEADLINE)
deadline_event.wait_for("never_sent", event="never")

# A sleep of an hour.
deadline_sleep = Workflow("deadline_sleep", deadline=DEADLINE, on_deadline="fail")
deadline_sleep.sleep("an_hour", timedelta(hours=1))

# No deadline of its own: start(deadline=...) gives one.
deadline_none = Workflow("deadline_none")
deadline_none.wait_for("go", event="go")

# A child that waits for ever, and a parent that starts it and joins it.
deadline_child = Workflow("deadline_child")
deadline_child.wait_for("forever", event="never")

deadline_parent = Workflow("deadline_parent", deadline=DEADLINE)


@deadline_parent.step(policy="re_executable")
def start_child(ctx: Any) -> dict[str, Any]:
    return {"child": ctx.start_run(deadline_child, {}, key="only")}


deadline_parent.join("children")

# A hold at the warehouse, then a wait for ever: at its deadline the stock is given back, then it ends.
deadline_holder = Workflow("deadline_holder", deadline=DEADLINE)


def _give_back(ctx: Any) -> dict[str, Any]:
    return systems().warehouse.release(ctx.results["reserve_stock"]["reservation_id"], key=ctx.effect_key)


@deadline_holder.step(policy="re_executable", release=_give_back)
def reserve_stock(ctx: Any) -> dict[str, Any]:
    return systems().warehouse.reserve(2, key=ctx.effect_key)


deadline_holder.wait_for("delivery", event="delivered")

# A child whose own workflow declares a deadline, started by a parent that has none.
deadline_own_child = Workflow("deadline_own_child", deadline=DEADLINE, on_deadline="fail")
deadline_own_child.wait_for("forever", event="never")

deadline_starter = Workflow("deadline_starter")


@deadline_starter.step(policy="resolvable", lookup=lambda ctx: None)
def start_timed_child(ctx: Any) -> dict[str, Any]:
    return {"child": ctx.start_run(deadline_own_child, {}, key="timed")}


@deadline_starter.step(policy="re_executable")
def start_timed_child_too(ctx: Any) -> dict[str, Any]:
    return {"child": ctx.start_run(deadline_own_child, {}, key="timed_too")}


deadline_starter.join("both")
