"""Measure a step's checkpointed loop and print the checkpoint trade-off for it (design source: pick `every`
from two measurements, never a guess).

    python manage.py measure_loop WORKFLOW STEP [--input JSON] [--results JSON] [--every 1,5,10,25,50,100]

The step runs once, in this process, with a context whose loop() times every item and commits a real
checkpoint (store.checkpoint, the engine's own write) after every item, on a scratch run created for the
purpose and deleted afterwards whatever happens. The scratch run names no registered workflow, so a worker
that claimed it by chance would fail it without running anything. Only re_executable steps are measured:
running any other step would act on a far system.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from durableruns import conf, store
from durableruns.context import StepContext
from durableruns.engine import ensure_autocommit
from durableruns.errors import DeclarationError, UnknownWorkflow
from durableruns.models import RunState
from durableruns.policies import Policy
from durableruns.registry import Step, effect_key, get_workflow
from durableruns.tradeoff import DEFAULT_BATCH_SIZES, LoopTiming, balance_point, loop_timing, render, tradeoff

T = TypeVar("T")
SCRATCH_PREFIX = "measure-loop-"
SCRATCH_WORKFLOW = "durableruns.measure_loop (scratch run)"  # never registered: a worker cannot run it
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
                         progress=progress, now=timezone.now())
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
    now = timezone.now()
    try:
        store.create_run(run_id=run_id, workflow=SCRATCH_WORKFLOW, plan_fingerprint="-", input={}, now=now)
        claimed = store.claim(owner=f"measure_loop:{run_id}", lease_seconds=SCRATCH_LEASE_SECONDS, now=now,
                              run_id=run_id)
        if claimed is None:
            raise CommandError(f"a worker took the scratch run {run_id} before this command could; run it again")
        store.record_intent(claimed.lease, store.Intent(step=step.name, attempt=1,
                                                        effect_key=effect_key(run_id, step.name), cursor=0), now=now)
        yield claimed.lease
    finally:
        # Scratch rows only: nothing of a real run is ever deleted (run_step goes with it, ON DELETE CASCADE).
        RunState.objects.filter(pk=run_id).delete()


def measure(step: Step, *, input: dict[str, Any], results: dict[str, Any]) -> Measurement:
    """Run `step` once with a MeasuringContext; its loop's per-item and per-commit times."""
    with scratch_run(step) as lease:
        ctx = MeasuringContext(lease=lease, run_id=lease.run_id, step=step.name, input=input, results=results,
                               effect_key=effect_key(lease.run_id, step.name), attempt=1,
                               timeout=step.timeout or conf.default_timeout())
        ensure_autocommit()
        began = time.perf_counter()
        step.fn(ctx)
        step_seconds = time.perf_counter() - began
    if ctx.every is None:
        raise CommandError(f"{step.name} never called ctx.loop(...): it has no checkpointed loop to measure")
    try:
        timing = loop_timing(ctx.item_seconds, ctx.commit_seconds)
    except ValueError as exc:
        raise CommandError(f"{step.name}: {exc}") from None
    return Measurement(timing=timing, every=ctx.every, step_seconds=step_seconds)


def measurable_step(workflow_name: str, step_name: str) -> Step:
    """The declared step, if it exists and running it acts on nothing outside the run."""
    try:
        workflow = get_workflow(workflow_name)
    except UnknownWorkflow as exc:
        raise CommandError(str(exc)) from None
    try:
        step = workflow[step_name]
    except KeyError:
        raise CommandError(f"{workflow_name} has no step {step_name!r} (steps: {', '.join(workflow.plan)})") from None
    if step.policy is not Policy.RE_EXECUTABLE:
        raise CommandError(
            f"{workflow_name}.{step_name} is {step.policy.value}: running it would act on a far system, so "
            "measure_loop refuses; it measures re_executable steps only (time such a loop in a staging run)"
        )
    return step


def _json_object(option: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(f"{option} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CommandError(f"{option} must be a JSON object, not {type(value).__name__}")
    return value


def _batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--every takes whole numbers separated by commas, not {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("--every takes batch sizes of at least 1")
    return sizes


class Command(BaseCommand):
    help = ("Run a re_executable step once, time each item of its ctx.loop and real checkpoint commits (on a "
            "scratch run, deleted afterwards), and print commit overhead against worst-case rework per batch size.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("workflow")
        parser.add_argument("step")
        parser.add_argument("--input", default="{}", help="The run's input, a JSON object (default {}).")
        parser.add_argument("--results", default="{}",
                            help="Earlier steps' results the step reads, a JSON object by step name (default {}).")
        parser.add_argument("--every", type=_batch_sizes, default=DEFAULT_BATCH_SIZES,
                            help="Batch sizes to compare, comma-separated (default 1,5,10,25,50,100).")

    def handle(self, *args: Any, workflow: str, step: str, input: str, results: str, every: tuple[int, ...],
               **options: Any) -> None:
        declared = measurable_step(workflow, step)
        measured = measure(declared, input=_json_object("--input", input),
                           results=_json_object("--results", results))
        t = measured.timing
        sizes = sorted({*every, measured.every})
        self.stdout.write(f"{workflow}.{step}: {t.items} items in {measured.step_seconds:.3f} s; the step "
                          f"checkpoints every {measured.every}")
        self.stdout.write(f"per item t = {t.item_seconds * 1000:.3f} ms (mean of {t.items}); checkpoint commit "
                          f"c = {t.commit_seconds * 1000:.3f} ms (mean of {t.commits} real commits on a scratch run)")
        self.stdout.write("")
        for line in render(tradeoff(t.items, t.item_seconds, t.commit_seconds, sizes), marked=measured.every):
            self.stdout.write(line)
        b = balance_point(t.items, t.item_seconds, t.commit_seconds)
        self.stdout.write("")
        self.stdout.write(f"balance point b* = sqrt(n * c / t) = {b:.1f} items: checkpointing more often costs "
                          "more commit time than the rework it saves, less often risks more rework than it saves.")
