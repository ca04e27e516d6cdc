"""Workflows that exist only for the benchmarks: nine no-op steps, five steps that each wait on a far call, and
one step that loops at a real cost.

The runner registers them in its own process; the `manage.py resume_runs` workers it starts import this
module through DURABLERUNS_WORKFLOW_MODULES=bench.workflows, so both sides see the same plan fingerprint.
Every step is re_executable: a no-op has no effect anywhere, so running it again is always safe.
"""

from __future__ import annotations

import time
from datetime import timedelta
from dataclasses import dataclass, field
from typing import Any

from durableruns import Workflow

NOOP_STEPS = 9
noop9 = Workflow("bench_noop9")


def _noop_step(name: str) -> Any:
    def step(ctx: Any) -> None:
        return None

    step.__name__ = step.__qualname__ = name
    return step


for _index in range(1, NOOP_STEPS + 1):
    noop9.step(policy="re_executable")(_noop_step(f"step_{_index}"))

STEP_NAMES: tuple[str, ...] = noop9.plan

# The nine no-op steps declared intent=False, as the seed allows for a step with no external effect: no intent,
# and the run's nine results share one commit (durableruns.held). bench.engine_cost times both side by side.
noop9_held = Workflow("bench_noop9_held")
for _index in range(1, NOOP_STEPS + 1):
    noop9_held.step(policy="re_executable", intent=False)(_noop_step(f"step_{_index}"))

# The commit-limit load (bench.commit_limit): five no-op steps, as in issue 34's measurement against pgbench.
NOOP5_STEPS = 5
noop5 = Workflow("bench_noop5")
for _index in range(1, NOOP5_STEPS + 1):
    noop5.step(policy="re_executable")(_noop_step(f"step_{_index}"))

# The same five no-op steps declared as the seed says a step with no external effect may be: intent=False. No
# intent is recorded, and the results share one commit (durableruns.held): a run is its claim and one commit.
noop5_held = Workflow("bench_noop5_held")
for _index in range(1, NOOP5_STEPS + 1):
    noop5_held.step(policy="re_executable", intent=False)(_noop_step(f"step_{_index}"))

# The same nine no-op steps, each declared wait_for_standby=True: with DURABLERUNS_STANDBY_INTENTS set, every
# intent commit of theirs waits for the synchronous standby (bench.standby_cost).
guarded9 = Workflow("bench_guarded9")
for _index in range(1, NOOP_STEPS + 1):
    guarded9.step(policy="re_executable", wait_for_standby=True)(_noop_step(f"step_{_index}"))
IN_DOUBT_STEP = STEP_NAMES[4]  # the recovery benchmark's runs die in step 5, after four completed steps

# Real-shaped work: each step waits 20 ms, as a call to a far system would, and does nothing else. The thread
# sleeps (time.sleep releases the GIL), so a process can have many of these calls in flight at once.
IO_STEPS = 5
IO_STEP_SECONDS = 0.02
io5 = Workflow("bench_io5")


def _far_call_step(name: str) -> Any:
    def step(ctx: Any) -> None:
        time.sleep(IO_STEP_SECONDS)

    step.__name__ = step.__qualname__ = name
    return step


for _index in range(1, IO_STEPS + 1):
    io5.step(policy="re_executable")(_far_call_step(f"call_{_index}"))


@dataclass
class LoopSample:
    """What one pass of `price_lines` saw: each item's work, each gap between items, the step's wall time."""

    every: int
    items: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    step_seconds: float = 0.0

    def checkpoint_gaps(self) -> list[float]:
        """The gaps after which ctx.loop committed a checkpoint (after item k*every, never after the last)."""
        return [gap for index, gap in enumerate(self.gaps, start=1) if index % self.every == 0]

    def plain_gaps(self) -> list[float]:
        return [gap for index, gap in enumerate(self.gaps, start=1) if index % self.every != 0]


# Filled by `price_lines` when it runs in the runner's own process; the loop benchmark reads and clears it.
loop_samples: list[LoopSample] = []

loop = Workflow("bench_loop")


@loop.step(policy="re_executable")
def price_lines(ctx: Any) -> dict[str, Any]:
    """Walk `items` lines at `item_seconds` each (a real sleep), checkpointing every `every` lines.

    The gap between finishing one line and being handed the next is ctx.loop's own time: a few
    microseconds, or one checkpoint commit when the line closed a batch.
    """
    count, every, cost = int(ctx.input["items"]), int(ctx.input["every"]), float(ctx.input["item_seconds"])
    sample = LoopSample(every=every)
    began = time.perf_counter()
    finished: float | None = None
    for _line in ctx.loop(range(count), every=every):
        start = time.perf_counter()
        if finished is not None:
            sample.gaps.append(start - finished)
        time.sleep(cost)
        finished = time.perf_counter()
        sample.items.append(finished - start)
    sample.step_seconds = time.perf_counter() - began
    loop_samples.append(sample)
    return {"lines": len(sample.items)}


# Filled by `quote_lines_at_once` when it runs in the runner's own process; the map benchmark reads and clears it.
map_samples: list[float] = []

fanout = Workflow("bench_map")


@fanout.step(policy="re_executable")
def quote_lines_at_once(ctx: Any) -> dict[str, Any]:
    """Price `items` lines at `item_seconds` each (a real sleep) with ctx.map on `concurrency` threads; the
    step records the map's own wall time."""
    count, cost = int(ctx.input["items"]), float(ctx.input["item_seconds"])

    def price(line: int) -> int:
        time.sleep(cost)
        return line

    began = time.perf_counter()
    lines = ctx.map(price, range(count), concurrency=int(ctx.input["concurrency"]), every=int(ctx.input["every"]))
    map_samples.append(time.perf_counter() - began)
    return {"lines": len(lines)}


# Runs that wait (bench/waits.py): one that waits for an event, one that sleeps a while; each then one no-op step.
wait_event = Workflow("bench_wait_event")
wait_event.wait_for("go")
wait_event.step(policy="re_executable")(_noop_step("after_event"))

sleep_then = Workflow("bench_sleep_then")
sleep_then.sleep("nap", lambda ctx: timedelta(milliseconds=float(ctx.input["ms"])))
sleep_then.step(policy="re_executable")(_noop_step("after_nap"))

# Child runs (bench/children.py): a parent starts `children` child runs of one no-op step each, joins them, and
# counts what the join returned.
child_noop = Workflow("bench_child")
child_noop.step(policy="re_executable")(_noop_step("child_step"))

parent_fan = Workflow("bench_parent")


@parent_fan.step(policy="re_executable")
def start_children(ctx: Any) -> dict[str, Any]:
    return {"started": len([ctx.start_run(child_noop, {"n": n}, key=n) for n in range(int(ctx.input["children"]))])}


parent_fan.join("children")


@parent_fan.step(policy="re_executable")
def count_children(ctx: Any) -> dict[str, Any]:
    return {"completed": sum(c["status"] == "completed" for c in ctx.results["children"].values())}

# Rate limits (bench/rates.py): one step of at most 5 starts a second, one bucket for the step; its result is the
# worker's wall clock as it ran (the "far system's" clock: every worker is on this one host).
rated = Workflow("bench_rated")


@rated.step(policy="re_executable", rate="5/s")
def rated_call(ctx: Any) -> dict[str, Any]:
    return {"at": time.time()}
