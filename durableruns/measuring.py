"""Measure a step's checkpointed loop: the two figures the design source picks `every` from, never a guess.

The step runs once, in this process, with a context whose loop() times every item and commits a real
checkpoint (store.checkpoint, the engine's own write) after every item, on a scratch run created for the
purpose and deleted afterwards whatever happens. The scratch run names no registered workflow, so a worker
that claimed it by chance would fail it without running anything. Only re_executable steps are measured:
running any other step would act on a far system.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from durableruns import store
from durableruns.context import StepContext
from durableruns.errors import DeclarationError, NotMeasurable, UnknownWorkflow
from durableruns.passes import ensure_autocommit, step_timeout
from durableruns.policies import Policy
from durableruns.registry import Step, effect_key, get_workflow
from durableruns.tradeoff import LoopTiming, loop_timing

T = TypeVar("T")
SCRATCH_PREFIX = "measure-loop-"
SCRATCH_LEASE_SECONDS = 6 * 3600.0


class MeasuringContext(StepContext):
    """A step context whose loop() times each item and commits a real checkpoint after each one.

    The time from handing out an item to being asked for the next is the step's work on that item; the
    checkpoint commit happens in between, inside the loop, and is timed on its own.
    """

    def __init__(self, *, lease: store.Lease, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._lease = lease
        self._checkpoint = self._commit
        self.item_seconds: list[float] = []
        self.commit_seconds: list[float] = []
        self.every: int | None = None  # what the step passed to ctx.loop

    def loop(self, items: Sequence[T], every: int = 25) -> Iterator[T]:
        if every < 1:
            raise DeclarationError("loop(every=...) must be at least 1")
        self.every = every
        for item in super().loop(items, every=1):
            began = time.perf_counter()
            yield item
            self.item_seconds.append(time.perf_counter() - began)

    def _commit(self, loop_cursor: int, progress: dict[str, Any]) -> None:
        began = time.perf_counter()
        store.checkpoint(self._lease, step=self.step, attempt=self.attempt, loop_cursor=loop_cursor,
                         progress=progress)
        self.commit_seconds.append(time.perf_counter() - began)


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """One measured pass of a step's loop."""

    timing: LoopTiming
    every: int
    step_seconds: float


@contextmanager
def scratch_run(step: Step) -> Iterator[store.Lease]:
    """A run held under a long lease with `step` started, to commit real checkpoints on; deleted on exit."""
    run_id = f"{SCRATCH_PREFIX}{uuid.uuid4().hex}"
    try:
        store.create_run(run_id=run_id, workflow=store.SCRATCH_WORKFLOW, plan_fingerprint="-", input={})
        claimed = store.claim(owner=f"measure_loop:{run_id}", lease_seconds=SCRATCH_LEASE_SECONDS, run_id=run_id)
        if claimed is None:
            raise NotMeasurable(f"a worker took the scratch run {run_id} before the measurement could; try again")
        store.record_intent(claimed.lease, store.Intent(step=step.name, attempt=1,
                                                        effect_key=effect_key(run_id, step.name), cursor=0))
        yield claimed.lease
    finally:
        store.delete_scratch_run(run_id)


def measure(step: Step, *, input: dict[str, Any], results: dict[str, Any]) -> Measurement:
    """Run `step` once with a MeasuringContext; its loop's per-item and per-commit times."""
    with scratch_run(step) as lease:
        ctx = MeasuringContext(lease=lease, run_id=lease.run_id, step=step.name, input=input, results=results,
                               effect_key=effect_key(lease.run_id, step.name), attempt=1,
                               timeout=step_timeout(step))
        ensure_autocommit()
        began = time.perf_counter()
        step.fn(ctx)
        step_seconds = time.perf_counter() - began
    if ctx.every is None:
        raise NotMeasurable(f"{step.name} never called ctx.loop(...): it has no checkpointed loop to measure")
    try:
        timing = loop_timing(ctx.item_seconds, ctx.commit_seconds)
    except ValueError as exc:
        raise NotMeasurable(f"{step.name}: {exc}") from None
    return Measurement(timing=timing, every=ctx.every, step_seconds=step_seconds)


def measurable_step(workflow_name: str, step_name: str) -> Step:
    """The declared step, if it exists and running it acts on nothing outside the run."""
    try:
        workflow = get_workflow(workflow_name)
    except UnknownWorkflow as exc:
        raise NotMeasurable(str(exc)) from None
    try:
        step = workflow[step_name]
    except KeyError:
        raise NotMeasurable(f"{workflow_name} has no step {step_name!r} (steps: {', '.join(workflow.plan)})") from None
    if step.policy is not Policy.RE_EXECUTABLE:
        raise NotMeasurable(
            f"{workflow_name}.{step_name} is {step.policy.value}: running it would act on a far system, so "
            "measure_loop refuses; it measures re_executable steps only (time such a loop in a staging run)"
        )
    return step
