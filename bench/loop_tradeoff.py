"""The loop checkpoint trade-off of the design source, measured through the real engine on PostgreSQL.

A 240-item loop whose every item costs a real sleep (5 ms at full size) runs as one step of a run worked in
this process by services.resume_due, with ctx.loop(every=b) for b in 1, 5, 10, 25, 50, 100 and once with b
past the item count (no checkpoint at all), in rotating rounds. The step times itself: each item's work, the
gap before the next item (a few microseconds, or one checkpoint commit when the item closed a batch) and its
whole wall time. For each b it reports the commit overhead two ways, from the step's time against the
no-checkpoint pass of the same round and from the timed checkpoint gaps, and the worst-case rework (b items,
b times the measured per-item time); then durableruns.tradeoff's model with the measured per-item time t and
checkpoint time c, and the balance point b* = sqrt(n * c / t) where the commit time equals the rework.
"""

from __future__ import annotations

import math
from typing import Any

from bench import app, workflows
from bench.stats import rotation, summarize
from bench.workflows import LoopSample
from durableruns import services, tradeoff

WORKFLOW = workflows.loop.name


def one_pass(*, items: int, item_seconds: float, every: int) -> LoopSample:
    """One run of the loop step through the engine; the step's own timings."""
    workflows.loop_samples.clear()
    services.start_run(WORKFLOW, {"items": items, "item_seconds": item_seconds, "every": every})
    report = services.resume_due(limit=1)
    if report.counts() != {"completed": 1} or len(workflows.loop_samples) != 1:
        raise RuntimeError(f"the loop run did not complete in one pass: {report.summary()}")
    return workflows.loop_samples.pop()


def measure(*, items: int, item_seconds: float, batch_sizes: tuple[int, ...], repeat: int) -> dict[str, Any]:
    """Figure 6: per b, the commit overhead (measured two ways) and the worst-case rework; the model and b*."""
    app.reset()
    without = items + 1  # every > items: the loop never checkpoints
    configs = [*batch_sizes, without]
    one_pass(items=items, item_seconds=item_seconds, every=batch_sizes[0])  # warm-up: connection, imports
    passes: dict[int, list[LoopSample]] = {every: [] for every in configs}
    for _, every in rotation(configs, repeat):
        passes[every].append(one_pass(items=items, item_seconds=item_seconds, every=every))
    app.reset()

    timing = tradeoff.loop_timing([d for s in _all(passes) for d in s.items],
                                  [g for s in _all(passes) for g in s.checkpoint_gaps()])
    plain_gap = _mean([g for s in _all(passes) for g in s.plain_gaps()])
    model = {row.every: row for row in tradeoff.tradeoff(items, timing.item_seconds, timing.commit_seconds,
                                                          batch_sizes)}
    baseline = [s.step_seconds for s in passes[without]]
    rows = []
    for every in batch_sizes:
        samples = passes[every]
        row = model[every]
        rows.append({
            "every": every,
            "checkpoints": row.checkpoints,
            "step_s": summarize([s.step_seconds for s in samples]),
            # paired by round, so a load that drifts between rounds cancels out
            "overhead_vs_no_checkpoint_pct": summarize(
                [100 * (s.step_seconds - base) / s.step_seconds for s, base in zip(samples, baseline)]),
            "checkpoint_ms": summarize([1000 * _mean(s.checkpoint_gaps()) for s in samples]),
            "overhead_timed_pct": summarize(
                [100 * math.fsum(s.checkpoint_gaps()) / s.step_seconds for s in samples]),
            "overhead_model_pct": 100 * row.overhead_fraction,
            "commit_time_model_s": row.overhead_seconds,
            "rework_items": row.rework_items,
            "rework_s": row.rework_seconds,
        })
    balance = tradeoff.balance_point(items, timing.item_seconds, timing.commit_seconds)
    return {
        "rows": rows,
        "no_checkpoint_step_s": summarize(baseline),
        "item_ms": 1000 * timing.item_seconds,
        "checkpoint_ms": 1000 * timing.commit_seconds,
        "plain_gap_us": 1e6 * plain_gap,
        "balance_point": balance,
        "model_table": tradeoff.render(list(model.values())),
        "params": {"items": items, "item_sleep_ms": 1000 * item_seconds, "batch_sizes": list(batch_sizes),
                   "no_checkpoint_every": without, "rounds": repeat,
                   "per_item_cost": f"time.sleep({item_seconds}) per item, a stand-in for a price lookup",
                   "path": "services.start_run + services.resume_due in-process; ctx.loop(every=b) commits "
                           "store.checkpoint (one fenced statement) after every b-th item",
                   "model": "commit time (n-1)//b * c against rework b * t; b* = sqrt(n * c / t); t and c are "
                            "means over every pass"},
    }


def _all(passes: dict[int, list[LoopSample]]) -> list[LoopSample]:
    return [s for samples in passes.values() for s in samples]


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0
