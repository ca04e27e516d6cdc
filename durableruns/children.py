"""Child runs: a step starts runs of its own (ctx.start_run) and a later join waits until they end.

A child's run_id is derived from its parent, the step and the caller's key, `<parent>/<step>/<key>`, so a step
run again after a crash asks for the same run_id, and the record answers: the child exists already (same
workflow and input: the same child), or it is another (InvalidInput). A re_executable step's children are
recorded in its result's commit (a crash before it runs the step again, which asks for them again); any other
step's at once, each in its own commit fenced on the parent's epoch (a lookup or a person may settle that step
without running it again). Either way a child exists no later than the step's result, with its parent on it,
and never twice. The join's rule is pure (durableruns.waits); this module reads the facts it needs.
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
from durableruns.registry import Workflow, startable
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
            f"shorter key",
            run_id=run_id[:RUN_ID_LIMIT],
            step=step,
        )
    return run_id


def _asked(parent: str, step: str, workflow: Workflow | str, input: Any, key: Any) -> store.NewChild:
    # An internal workflow is never a child's: refused as a name nobody declared is (UnknownWorkflow).
    flow = workflow if isinstance(workflow, Workflow) and not workflow.internal else startable(workflow)
    if not isinstance(input, dict):
        raise InvalidInput(f"a child run's input must be a JSON object, not {type(input).__name__}")
    try:
        stored = json.loads(store.to_json(input, what="the child run's input"))
    except ResultNotJSON as exc:
        raise InvalidInput(str(exc)) from None
    concurrency_key = flow.limit_key(stored)  # asked once, here, and recorded, as start() asks it
    if concurrency_key is not None and len(concurrency_key) > RUN_ID_LIMIT:
        raise InvalidInput(
            f"the concurrency key of {flow.name} must be at most {RUN_ID_LIMIT} characters, not "
            f"{concurrency_key[:60]!r}"
        )
    return store.NewChild(
        run_id=child_run_id(parent, step, key),
        workflow=flow.name,
        plan=flow.as_plan(),
        input=stored,
        concurrency_key=concurrency_key,
        deadline=flow.deadline,  # its workflow's own (durableruns.deadlines); its parent's ends it too, cancelled
        on_deadline=flow.on_deadline if flow.deadline is not None else None,
        attributes=flow.attributes_of(stored),  # asked once, as start() asks them
    )


def start(
    lease: store.Lease, step: str, workflow: Workflow | str, input: Any, *, key: Any, clock: Clock = store.DATABASE
) -> str:
    """Start (or find again) the child `key` of `step` of the run `lease` holds, in a commit of its own; return
    its run_id. For a step that is not re_executable: its attempt may be settled by a lookup or a person without
    running again, so what it started must be in the record at once."""
    child = _asked(lease.run_id, step, workflow, input, key)
    store.start_child(
        lease,
        run_id=child.run_id,
        workflow=child.workflow,
        plan=child.plan,
        input=child.input,
        concurrency_key=child.concurrency_key,
        deadline=child.deadline,
        on_deadline=child.on_deadline,
        attributes=child.attributes,
        clock=clock,
    )
    return child.run_id


def ask(
    parent: str, step: str, workflow: Workflow | str, input: Any, *, key: Any, asked: dict[str, store.NewChild]
) -> str:
    """Ask for the child `key` of `step` of run `parent`, to be recorded with the step's result (store.
    record_result, in the same commit): for a re_executable step, which runs again whenever its result is not
    recorded, so its children exist exactly when its result does (100 children: one commit, not 100). A child in
    the record already (the step ran before, or another attempt recorded it) is compared, not asked again; the
    same key asked twice in one attempt must ask for the same child. Return its run_id."""
    child = _asked(parent, step, workflow, input, key)
    earlier = asked.get(child.run_id)
    if earlier is not None:
        if (earlier.workflow, earlier.input) != (child.workflow, child.input):
            raise InvalidInput(
                f"child run {child.run_id} was asked for with another workflow or input "
                f"({earlier.workflow}): a key names one child",
                run_id=child.run_id,
            )
        return child.run_id
    if not store.child_exists(child, parent=parent):
        asked[child.run_id] = child
    return child.run_id


def children_of(run_id: str) -> tuple[Child, ...]:
    """Every child run of `run_id`, in run_id order, with its status (no results: see with_results)."""
    rows = RunState.objects.children_of(run_id).values_list("run_id", "status", "reason")
    return tuple(Child(run_id=r, status=status, reason=reason) for r, status, reason in rows)


def with_results(children: tuple[Child, ...]) -> tuple[Child, ...]:
    """The children with their results by step: each step's latest completed attempt (releases left out), read
    in one query."""
    results: dict[str, dict[str, Any]] = defaultdict(dict)
    rows = (
        RunStep.objects.filter(run_id__in=[c.run_id for c in children], status=StepStatus.COMPLETED)
        .order_by("run_id", "attempt")
        .values_list("run_id", "step", "result")
    )
    for run_id, step, result in rows:
        if not step.endswith(RELEASE_SUFFIX):
            results[run_id][step] = result
    return tuple(Child(run_id=c.run_id, status=c.status, reason=c.reason, results=results[c.run_id]) for c in children)
