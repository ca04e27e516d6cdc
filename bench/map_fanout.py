"""ctx.map against the ideal and against the serial ctx.loop, through the real engine on PostgreSQL.

The same 240 lines at a real sleep each (50 ms at full size, a stand-in for a supplier portal's price call) are
priced by one step of a run worked in this process by services.resume_due: once with ctx.map(concurrency=16,
every=25), once with ctx.loop(every=25), in rotating rounds. Each pass is timed whole (start_run excluded,
resume_due's claim, intent, checkpoints and result commit included); the map step also times its own map call.
The ideal is what 16 threads could do with no overhead at all: ceil(240 / 16) x 50 ms.
"""

from __future__ import annotations

import math
import time
from typing import Any

from bench import app, workflows
from bench.stats import ratio, rotation, summarize
from durableruns import services

EVERY = 25


def one_pass(workflow: str, **input: Any) -> float:
    """Seconds of one resume_due pass that works the run through; the run must complete in it."""
    services.start_run(workflow, input)
    began = time.perf_counter()
    report = services.resume_due(limit=1)
    seconds = time.perf_counter() - began
    if report.counts() != {"completed": 1}:
        raise RuntimeError(f"the {workflow} run did not complete in one pass: {report.summary()}")
    return seconds


def measure(*, items: int, item_seconds: float, concurrency: int, repeat: int) -> dict[str, Any]:
    """The map's pass against the ideal and against the serial loop's pass, side by side."""
    app.reset()
    work = {"items": items, "item_seconds": item_seconds, "every": EVERY}
    kinds = {
        "map": lambda: one_pass(workflows.fanout.name, concurrency=concurrency, **work),
        "loop": lambda: one_pass(workflows.loop.name, **work),
    }
    kinds["map"]()  # warm-up: connection, imports
    workflows.map_samples.clear()
    workflows.loop_samples.clear()
    seconds: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _, kind in rotation(list(kinds), repeat):
        seconds[kind].append(kinds[kind]())
    app.reset()
    ideal = math.ceil(items / concurrency) * item_seconds
    ideal_summary = summarize([ideal])
    map_s, loop_s = summarize(seconds["map"]), summarize(seconds["loop"])
    return {
        "map_s": map_s,
        "map_call_s": summarize(workflows.map_samples),
        "loop_s": loop_s,
        "ideal_s": ideal,
        "map_over_ideal": ratio(map_s, ideal_summary),
        "map_over_loop": ratio(map_s, loop_s),
        "params": {"items": items, "item_sleep_ms": 1000 * item_seconds, "concurrency": concurrency,
                   "every": EVERY, "rounds": repeat,
                   "path": "services.start_run, then one services.resume_due pass timed whole: claim, intent, the "
                           "step (ctx.map(concurrency=c, every=25) or ctx.loop(every=25)), checkpoints, result",
                   "ideal": "ceil(items / concurrency) x item time: the threads' work with no overhead"},
    }
