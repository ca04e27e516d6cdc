"""ctx.map's own rules, without a database: what each checkpoint carries, several maps and a loop in one step,
the first exception after the items in flight, and a new attempt that starts from what a checkpoint holds."""

from __future__ import annotations

import copy
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from durableruns.context import MAP_KEY, StepContext
from durableruns.errors import DeclarationError, ResultNotJSON


def context(saved: list[tuple[int, dict[str, Any]]], progress: dict[str, Any] | None = None,
            loop_start: int = 0) -> StepContext:
    return StepContext(run_id="r", step="quote", input={}, results={}, effect_key="r:quote", attempt=1,
                       timeout=timedelta(seconds=1), progress=progress, loop_start=loop_start,
                       checkpoint=lambda cursor, progress: saved.append((cursor, copy.deepcopy(progress))))


def test_results_in_item_order_and_a_checkpoint_every_every_results():
    saved: list[tuple[int, dict[str, Any]]] = []
    ctx = context(saved)
    assert ctx.map(lambda n: (n, n * n), range(10), concurrency=3, every=4) == [[n, n * n] for n in range(10)]
    # After the 4th and the 8th result (never after the last: the step's result commit holds them all).
    assert [len(p[MAP_KEY]["0"]) for _, p in saved] == [4, 8]
    assert ctx.progress == {}  # the maps' bookkeeping is not the step's progress


def test_a_second_map_and_a_loop_in_the_same_step_keep_each_others_checkpoints():
    saved: list[tuple[int, dict[str, Any]]] = []
    ctx = context(saved)
    ctx.progress["seen"] = []
    first = ctx.map(str, range(3), every=1)
    for item in ctx.loop(list(range(4)), every=2):
        ctx.progress["seen"].append(item)
    second = ctx.map(lambda n: n + 100, range(2), every=1)
    assert first == ["0", "1", "2"] and second == [100, 101]
    cursor, last = saved[-1]
    assert cursor == 2  # the loop's cursor as last committed, kept by the map's checkpoint
    assert last["seen"] == [0, 1, 2, 3] and last[MAP_KEY] == {"0": {"0": "0", "1": "1", "2": "2"}, "1": {"0": 100}}
    loop_checkpoint = next(p for c, p in saved if c == 2)
    assert loop_checkpoint[MAP_KEY]["0"] == {"0": "0", "1": "1", "2": "2"}  # the loop's commit keeps the map's


def test_a_new_attempt_calls_fn_only_for_the_items_no_checkpoint_holds():
    saved: list[tuple[int, dict[str, Any]]] = []
    called: list[int] = []
    ctx = context(saved, progress={"kept": 1, MAP_KEY: {"0": {"0": "a", "2": "c"}}})
    assert ctx.progress == {"kept": 1}
    assert ctx.map(lambda n: called.append(n) or "abcd"[n], range(4), concurrency=2) == ["a", "b", "c", "d"]
    assert sorted(called) == [1, 3]


def test_the_first_exception_is_raised_after_the_items_in_flight_finish_and_are_checkpointed():
    saved: list[tuple[int, dict[str, Any]]] = []
    started, finished = [], []
    slow_started = threading.Event()

    def fn(n: int) -> int:
        started.append(n)
        if n == 0:
            slow_started.wait(2)
            raise ValueError("item 0 refused")
        slow_started.set()
        time.sleep(0.3)  # in flight when item 0 raises
        finished.append(n)
        return n

    ctx = context(saved)
    with pytest.raises(ValueError, match="item 0 refused"):
        ctx.map(fn, range(20), concurrency=2, every=100)
    assert finished == [1]  # the item in flight finished before the exception came out
    assert sorted(started) == [0, 1]  # and no new item started after item 0 raised
    assert saved[-1][1][MAP_KEY] == {"0": {"1": 1}}  # its result is kept for the next attempt


def test_a_result_that_is_not_json_is_that_items_error_and_threads_and_arguments_are_checked():
    ctx = context([])
    with pytest.raises(ResultNotJSON, match="item 1"):
        ctx.map(lambda n: object() if n == 1 else n, range(3), concurrency=1)
    with pytest.raises(DeclarationError):
        ctx.map(str, range(3), concurrency=0)
    with pytest.raises(DeclarationError):
        ctx.map(str, range(3), every=0)
    before = threading.active_count()
    ctx.map(str, range(50), concurrency=8)
    assert threading.active_count() == before  # the map's threads have ended when it returns
