"""The loop checkpoint trade-off as a pure table: commits fall as b grows, rework rises, and they meet at b*."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from durableruns.context import StepContext
from durableruns.tradeoff import (
    DEFAULT_BATCH_SIZES,
    TradeoffRow,
    balance_point,
    checkpoints,
    loop_timing,
    render,
    tradeoff,
)


@pytest.mark.parametrize(
    ("items", "every", "commits"),
    [
        (240, 1, 239),  # after every item but the last
        (240, 25, 9),  # after 25, 50, ..., 225: the design source's "ten extra commits", counted exactly
        (240, 24, 9),  # 240 is a multiple of 24: no commit after the last item
        (240, 100, 2),
        (240, 240, 0),
        (240, 241, 0),
        (1, 1, 0),
        (0, 5, 0),
    ],
)
def test_checkpoints_counts_what_ctx_loop_commits(items, every, commits):
    assert checkpoints(items, every) == commits


def test_checkpoints_match_ctx_loop_itself():
    for items, every in [(240, 25), (240, 1), (7, 3), (10, 10)]:
        made: list[int] = []
        ctx = StepContext(run_id="r", step="s", input={}, results={}, effect_key="k", attempt=1,
                          timeout=timedelta(seconds=1), checkpoint=lambda cursor, progress: made.append(cursor))
        for _ in ctx.loop(list(range(items)), every=every):
            pass
        assert len(made) == checkpoints(items, every)


@pytest.mark.parametrize(
    ("every", "row"),
    [
        (1, TradeoffRow(every=1, checkpoints=239, overhead_seconds=0.239, overhead_fraction=0.239 / 1.439,
                        rework_items=1, rework_seconds=0.005)),
        (25, TradeoffRow(every=25, checkpoints=9, overhead_seconds=0.009, overhead_fraction=0.009 / 1.209,
                         rework_items=25, rework_seconds=0.125)),
        (300, TradeoffRow(every=300, checkpoints=0, overhead_seconds=0.0, overhead_fraction=0.0,
                          rework_items=240, rework_seconds=1.2)),
    ],
)
def test_a_row_is_commit_time_against_worst_case_rework(every, row):
    (got,) = tradeoff(240, 0.005, 0.001, [every])
    assert got.every == row.every and got.checkpoints == row.checkpoints and got.rework_items == row.rework_items
    for name in ("overhead_seconds", "overhead_fraction", "rework_seconds"):
        assert getattr(got, name) == pytest.approx(getattr(row, name))


def test_the_two_costs_move_in_opposite_directions():
    rows = tradeoff(240, 0.005, 0.0004, DEFAULT_BATCH_SIZES)
    assert [r.every for r in rows] == list(DEFAULT_BATCH_SIZES)
    overheads = [r.overhead_seconds for r in rows]
    reworks = [r.rework_seconds for r in rows]
    assert overheads == sorted(overheads, reverse=True)
    assert reworks == sorted(reworks)


@pytest.mark.parametrize(
    ("items", "item_seconds", "commit_seconds", "expected"),
    [
        (240, 0.005, 0.0004, math.sqrt(240 * 0.0004 / 0.005)),
        (100, 1.0, 1.0, 10.0),
        (240, 0.27, 0.0045, 2.0),  # the design source's quote step: 47 s for 173 lookups, 3 to 6 ms commits
        (240, 0.005, 0.0, 0.0),  # free commits: checkpoint every item
        (240, 0.0, 0.001, math.inf),  # free items: never checkpoint
    ],
)
def test_balance_point_is_where_commit_time_equals_rework(items, item_seconds, commit_seconds, expected):
    b = balance_point(items, item_seconds, commit_seconds)
    assert b == pytest.approx(expected, rel=0.01)
    if 0 < b < math.inf:
        assert items / b * commit_seconds == pytest.approx(b * item_seconds)


def test_loop_timing_takes_means():
    timing = loop_timing([0.004, 0.006, 0.005], [0.001, 0.003])
    assert (timing.items, timing.commits) == (3, 2)
    assert timing.item_seconds == pytest.approx(0.005) and timing.commit_seconds == pytest.approx(0.002)


@pytest.mark.parametrize(
    ("items", "commits", "message"),
    [([], [0.001], "no items"), ([0.005], [], "at least two items")],
)
def test_loop_timing_refuses_what_cannot_be_measured(items, commits, message):
    with pytest.raises(ValueError, match=message):
        loop_timing(items, commits)


@pytest.mark.parametrize(
    "call",
    [
        lambda: tradeoff(240, 0.005, 0.001, [0]),
        lambda: tradeoff(-1, 0.005, 0.001),
        lambda: tradeoff(240, -0.005, 0.001),
        lambda: balance_point(240, 0.005, float("nan")),
        lambda: checkpoints(240, 0),
    ],
)
def test_nonsense_is_refused(call):
    with pytest.raises(ValueError):
        call()


def test_render_marks_the_steps_own_batch_size():
    lines = render(tradeoff(240, 0.005, 0.0004, [10, 25]), marked=25)
    assert lines[0].startswith("| every b |") and len(lines) == 4
    assert "| 25 (the step's) | 9 |" in lines[3] and "(the step's)" not in lines[2]
    assert "125.0 ms" in lines[3]
