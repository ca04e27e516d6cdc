"""Child runs: a step starts runs of its own (ctx.start_run) and a later join waits until they end.

A child's run_id is derived from its parent, the step and the caller's key, `<parent>/<step>/<key>`, so a step
run again after a crash asks for the same run_id, and the record answers: the child exists already (same
workflow and input: the same child), or it is another (InvalidInput). The child is recorded at once, in its own
commit fenced on the parent's epoch, with its parent on it (store.start_child): it exists before the step's
result does, never twice. The join's rule is pure (durableruns.waits); this module reads the facts it needs.
"""

from __future__ import annotations

import json
import unicodedata
from collections import defaultdict
from typing import Any

from durableruns import store
from durableruns.clock import Clock
from durableruns.errors import InvalidInput, ResultNotJSON
from durableruns.holdings import RELEASE_SUFFIX
from durableruns.models import RunState, RunStep, StepStatus
from durableruns.registry import Workflow, get_workflow
from durableruns.waits import Child

# The run_id column's length (RunState.run_id); a derived id longer than this is refused, never cut.
RUN_ID_LIMIT = 200


def child_run_id(parent: str, step: str, key: Any) -> str:
    """The run_id of the child `key` of step `step` of run `parent`: stable across attempts and resumes."""
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise InvalidInput(f"a child run's key must be a string or an integer, not {type(key).__name__}")
    text = str(key)
    if not text.strip():
        raise InvalidInput("a child run's key must not be empty")
    if any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in text):  # as services.start_run refuses
        raise InvalidInput(f"a child run's key holds a control character: {text!r}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"a child run's key holds a lone surrogate: {text!r}") from None
    run_id = f"{parent}/{step}/{text}"
    if len(run_id) > RUN_ID_LIMIT:
        raise InvalidInput(
            f"the child run_id {run_id[:60]!r}... would be {len(run_id)} characters long; a run_id holds at most "
            f"{RUN_ID_LIMIT} (the parent's id and the step's name take {len(parent) + len(step) + 2}): use a "
            f"shorter key", run_id=run_id[:RUN_ID_LIMIT], step=step)
    return run_id


def start(lease: store.Lease, step: str, workflow: Workflow | str, input: Any, *, key: Any,
          clock: Clock = store.DATABASE) -> str:
    """Start (or find again) the child `key` of `step` of the run `lease` holds; return its run_id."""
    flow = workflow if isinstance(workflow, Workflow) else get_workflow(workflow)
    if not isinstance(input, dict):
        raise InvalidInput(f"a child run's input must be a JSON object, not {type(input).__name__}")
    try:
        json.loads(store.to_json(input, what="the child run's input"))
    except ResultNotJSON as exc:
        raise InvalidInput(str(exc)) from None
    run_id = child_run_id(lease.run_id, step, key)
    store.start_child(lease, run_id=run_id, workflow=flow.name, plan=flow.as_plan(), input=input, clock=clock)
    return run_id


def children_of(run_id: str) -> tuple[Child, ...]:
    """Every child run of `run_id`, in run_id order, with its status (no results: see with_results)."""
    rows = RunState.objects.children_of(run_id).values_list("run_id", "status", "reason")
    return tuple(Child(run_id=r, status=status, reason=reason) for r, status, reason in rows)


def with_results(children: tuple[Child, ...]) -> tuple[Child, ...]:
    """The children with their results by step: each step's latest completed attempt (releases left out), read
    in one query."""
    results: dict[str, dict[str, Any]] = defaultdict(dict)
    rows = (RunStep.objects.filter(run_id__in=[c.run_id for c in children], status=StepStatus.COMPLETED)
            .order_by("run_id", "attempt").values_list("run_id", "step", "result"))
    for run_id, step, result in rows:
        if not step.endswith(RELEASE_SUFFIX):
            results[run_id][step] = result
    return tuple(Child(run_id=c.run_id, status=c.status, reason=c.reason, results=results[c.run_id])
                 for c in children)
