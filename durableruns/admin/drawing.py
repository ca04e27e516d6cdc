"""The run page's picture of its plan: the facts of one run gathered here (its plan, boundary, skipped steps,
lease and child runs), drawn by the pure durableruns.drawing, and handed to the template with a text equivalent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.utils.safestring import mark_safe

from durableruns import drawing, services
from durableruns.admin.display import run_url, when, zone_detail
from durableruns.boundary import Boundary
from durableruns.clock import Clock
from durableruns.models import Resolution, RunState, RunStatus, RunStep
from durableruns.waits import Child

# The drawing reads at most this many child runs of a run (each step draws a few, and counts the rest).
CHILDREN_READ = 500


def skipped_steps(rows: Sequence[RunStep]) -> set[str]:
    """The steps whose latest attempt is completed as skipped by its `when=`."""
    latest: dict[str, RunStep] = {}
    for row in rows:
        if row.step not in latest or row.attempt > latest[row.step].attempt:
            latest[row.step] = row
    return {step for step, row in latest.items() if row.resolution == Resolution.SKIPPED}


def is_live(run: RunState) -> bool:
    """Whether a worker holds the run now, under a lease the database's clock says has not expired."""
    if run.status != RunStatus.RUNNING or run.lease_expires_at is None:
        return False
    return run.lease_expires_at > Clock().now()


def plan_boxes(run: RunState, rows: Sequence[RunStep], boundary: Boundary, user: Any) -> tuple[drawing.StepBox, ...]:
    """The run's plan as boxes: the run's own plan where it is recorded (else the steps it attempted), each step's
    state and detail, and the child runs the user may see hanging off the step that started them."""
    plan = services.run_plan(run)
    steps = plan.steps if plan is not None else tuple((name, "") for name in boundary.plan)
    live = is_live(run)
    skipped = skipped_steps(rows)
    states = drawing.step_states(boundary, skipped=skipped, live=live)
    details: dict[str, str] = {}
    for name, state in states.items():
        latest = boundary.latest.get(name)
        if state is drawing.State.SKIPPED:
            details[name] = "its when= said no"
        elif state is drawing.State.RUNNING and latest is not None:
            details[name] = f"in hand since {when(latest.started_at)} on {run.owner} (attempt {latest.attempt})"
        else:
            details[name] = zone_detail(boundary.zone(name), latest)
    visible = RunState.objects.visible_to(user).children_of(run.run_id)
    found = [Child(run_id=r, status=s) for r, s in visible.values_list("run_id", "status")[:CHILDREN_READ]]
    urls = {c.run_id: run_url(c.run_id) for c in found}
    children = drawing.child_boxes(run.run_id, boundary.plan, found, urls)
    return drawing.boxes(steps, states, details=details, children=children)


def plan_drawing(run: RunState, rows: Sequence[RunStep], boundary: Boundary, user: Any) -> dict[str, Any]:
    """The template's facts: the SVG (every name in it escaped by durableruns.drawing), the legend and the boxes
    with their sentences, for the text equivalent."""
    drawn = plan_boxes(run, rows, boundary, user)
    svg = drawing.draw(drawn, title=f"The plan of run {run.run_id} ({run.workflow})")
    legend = [{"state": s.value, "label": look.label, "symbol": look.symbol} for s, look in drawing.LOOKS.items()]
    text = [{"name": box.name, "state": box.state.value, "label": drawing.LOOKS[box.state].label,
             "symbol": drawing.LOOKS[box.state].symbol, "sentence": drawing.describe(box)} for box in drawn]
    return {"plan_svg": mark_safe(svg), "plan_legend": legend, "plan_text": text}  # every name in it escaped

