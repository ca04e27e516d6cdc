"""The loop checkpoint trade-off of the design source, as a pure model of two measured figures.

A step that walks `items` items and commits its loop cursor every `b` items pays `(items - 1) // b`
checkpoint commits (ctx.loop never commits after the last item) and, if its worker dies, redoes at worst
`b` items. The commit time falls as `b` grows and the rework rises; with `t` seconds per item and `c` seconds
per checkpoint commit, `items / b * c` equals `b * t` at `b* = sqrt(items * c / t)`, the balance point.
Neither figure is guessed: `durableruns.management.commands.measure_loop` and the benchmark measure `t` and
`c`, and this module turns them into the table. No Django, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 5, 10, 25, 50, 100)


@dataclass(frozen=True, kw_only=True)
class LoopTiming:
    """What one pass of a loop measured: per-item and per-checkpoint-commit seconds (means)."""

    items: int
    item_seconds: float
    commit_seconds: float
    commits: int


@dataclass(frozen=True, kw_only=True)
class TradeoffRow:
    """The two costs of checkpointing every `every` items, for one batch size."""

    every: int
    checkpoints: int  # commits the loop makes: (items - 1) // every
    overhead_seconds: float  # checkpoints * commit_seconds
    overhead_fraction: float  # of the step's time: overhead / (items * item_seconds + overhead)
    rework_items: int  # worst case after a crash: the items since the last checkpoint, min(every, items)
    rework_seconds: float  # rework_items * item_seconds


def loop_timing(item_seconds: Sequence[float], commit_seconds: Sequence[float]) -> LoopTiming:
    """Reduce per-item and per-commit durations to their means (the costs that add up over a loop)."""
    if not item_seconds:
        raise ValueError("no item was timed: the loop had no items")
    if not commit_seconds:
        raise ValueError("no checkpoint commit was timed: the loop needs at least two items")
    return LoopTiming(items=len(item_seconds), item_seconds=math.fsum(item_seconds) / len(item_seconds),
                      commit_seconds=math.fsum(commit_seconds) / len(commit_seconds), commits=len(commit_seconds))


def checkpoints(items: int, every: int) -> int:
    """Checkpoint commits ctx.loop makes over `items` items: after every `every`-th, never after the last."""
    _check(items=items, every=every)
    return (items - 1) // every if items else 0


def tradeoff(items: int, item_seconds: float, commit_seconds: float,
             batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES) -> list[TradeoffRow]:
    """One row per batch size, in the order given: commit overhead against worst-case rework."""
    _check(items=items, item_seconds=item_seconds, commit_seconds=commit_seconds)
    work = items * item_seconds
    rows = []
    for every in batch_sizes:
        commits = checkpoints(items, every)
        overhead = commits * commit_seconds
        total = work + overhead
        rework = min(every, items)
        rows.append(TradeoffRow(every=every, checkpoints=commits, overhead_seconds=overhead,
                                overhead_fraction=overhead / total if total > 0 else 0.0,
                                rework_items=rework, rework_seconds=rework * item_seconds))
    return rows


def balance_point(items: int, item_seconds: float, commit_seconds: float) -> float:
    """The batch size where commit time `items / b * c` equals worst-case rework `b * t`: sqrt(items * c / t)."""
    _check(items=items, item_seconds=item_seconds, commit_seconds=commit_seconds)
    if item_seconds == 0:
        return math.inf
    return math.sqrt(items * commit_seconds / item_seconds)


def render(rows: Sequence[TradeoffRow], *, marked: int | None = None) -> list[str]:
    """The rows as a Markdown table, `marked` flagging the step's own batch size."""
    lines = ["| every b | checkpoints | commit time | overhead | worst-case rework | rework time |",
             "|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        flag = " (the step's)" if row.every == marked else ""
        lines.append(f"| {row.every}{flag} | {row.checkpoints} | {_seconds(row.overhead_seconds)} | "
                     f"{row.overhead_fraction:.2%} | {_items(row.rework_items)} | {_seconds(row.rework_seconds)} |")
    return lines


def _items(count: int) -> str:
    return f"{count} item" if count == 1 else f"{count} items"


def _seconds(value: float) -> str:
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _check(*, items: int | None = None, every: int | None = None, item_seconds: float | None = None,
           commit_seconds: float | None = None) -> None:
    if items is not None and items < 0:
        raise ValueError(f"items must be at least 0, not {items}")
    if every is not None and every < 1:
        raise ValueError(f"a batch size must be at least 1, not {every}")
    for name, value in (("item_seconds", item_seconds), ("commit_seconds", commit_seconds)):
        if value is not None and (value < 0 or math.isnan(value)):
            raise ValueError(f"{name} must be a non-negative number of seconds, not {value}")
