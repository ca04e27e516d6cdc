"""ctx.map in-process on the real database: results in item order, what the checkpoints hold, the first
exception after the items in flight, and a new attempt that calls the function only for unfinished items."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

import tests.workflows as flows
from durableruns import services, testing
from durableruns.context import MAP_KEY
from durableruns.models import RunState, RunStatus, RunStep
from tests.factories import crash_after_intent, make_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_backoff(settings):
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0


def calls(ledger: Path) -> list[tuple[int, int]]:
    """(attempt, item) per call of the mapped function, in the order they were made."""
    if not ledger.exists():
        return []
    return [(int(a), int(i)) for _, a, i in (line.split() for line in ledger.read_text().splitlines())]


def quote(run_id: str, ledger: Path, **spec: Any) -> str:
    return make_run("mapping", {"ledger": str(ledger), **spec}, run_id=run_id)


def priced(n: int) -> list[dict[str, int]]:
    return [{"item": i, "price": i * 3} for i in range(n)]


def attempt_row(run_id: str, attempt: int) -> RunStep:
    return RunStep.objects.get(run_id=run_id, step="quote_lines", attempt=attempt)


def test_map_returns_results_in_item_order_calling_each_item_once_on_threads(tmp_path):
    ledger = tmp_path / "ledger"
    run_id = quote("map-order", ledger, lines=40, concurrency=8, item_seconds=0.02)
    assert services.resume_due().counts() == {"completed": 1}
    assert attempt_row(run_id, 1).result == {"lines": priced(40)}
    made = calls(ledger)
    assert sorted(i for _, i in made) == list(range(40))  # each item once


def test_map_runs_items_at_once_up_to_its_concurrency(tmp_path):
    ledger = tmp_path / "ledger"
    quote("map-threads", ledger, lines=16, concurrency=4, item_seconds=0.05, touch_db=False)
    inflight, peak = [0], [0]
    original = flows._price

    def counting(ctx: Any) -> Any:
        price = original(ctx)
        lock = threading.Lock()

        def counted(item: int) -> Any:
            with lock:
                inflight[0] += 1
                peak[0] = max(peak[0], inflight[0])
            try:
                return price(item)
            finally:
                with lock:
                    inflight[0] -= 1

        return counted

    flows._price = counting
    try:
        assert services.resume_due().counts() == {"completed": 1}
    finally:
        flows._price = original
    assert peak[0] == 4  # four at once, never more


def test_checkpoints_hold_the_finished_results_every_every_items(tmp_path):
    ledger = tmp_path / "ledger"
    run_id = quote("map-every", ledger, lines=60, concurrency=4, every=10, item_seconds=0.01)
    committed: dict[int, int] = {}

    def look(point: str, step: str) -> None:
        if point.startswith("map:"):  # on the step's own thread, once item number N is collected
            progress = RunStep.objects.filter(run_id=run_id, step=step).values_list("progress", flat=True).get()
            committed[int(point[4:])] = len((progress or {}).get(MAP_KEY, {}).get("0", {}))

    testing.arm(look)
    try:
        assert services.resume_due().counts() == {"completed": 1}
    finally:
        testing.arm(None)
    # As the Nth result is collected (before its own checkpoint), the record holds the last multiple of `every`
    # below N: committed every 10 results, none after the last item (the result commit holds them all).
    assert committed == {n: (n - 1) // 10 * 10 for n in range(1, 61)}
    assert attempt_row(run_id, 1).result == {"lines": priced(60)}


def test_the_first_exception_is_raised_after_the_items_in_flight_and_a_retry_calls_only_the_rest(tmp_path):
    ledger = tmp_path / "ledger"
    run_id = quote("map-raise", ledger, lines=60, concurrency=4, every=25, item_seconds=0.02, fail=[30])
    assert services.resume_due().counts() == {"completed": 1}
    first = attempt_row(run_id, 1)
    assert first.status == "failed" and "line 30 has no price" in first.error
    made = calls(ledger)
    once = {i for a, i in made if a == 1}
    # No new item started once item 30 raised: at most the items in flight then, and a few the other threads
    # took before the step's thread saw the exception.
    assert 30 in once and len(once) <= 31 + 2 * 4
    # Every item that finished on attempt 1 (those in flight included) is in the failed attempt's checkpoint.
    kept = first.progress[MAP_KEY]["0"]
    assert {int(k) for k in kept} == once - {30}
    assert all(kept[str(i)] == {"item": i, "price": i * 3} for i in once - {30})
    # The new attempt starts from that checkpoint: it calls the function only for the items not kept.
    again = [i for a, i in made if a == 2]
    assert sorted(again) == sorted(set(range(60)) - (once - {30}))
    assert attempt_row(run_id, 2).result == {"lines": priced(60)}


def test_a_step_raising_after_its_map_keeps_the_results_for_the_next_attempt(tmp_path):
    ledger = tmp_path / "ledger"
    run_id = quote("map-after", ledger, lines=30, concurrency=4, every=100, raise_after=True)
    assert services.resume_due().counts() == {"completed": 1}
    assert attempt_row(run_id, 1).status == "failed"
    assert len(attempt_row(run_id, 1).progress[MAP_KEY]["0"]) == 30  # flushed as the step raised
    assert [a for a, _ in calls(ledger)] == [1] * 30  # attempt 2 called nothing
    assert attempt_row(run_id, 2).result == {"lines": priced(30)}


def test_a_resume_after_a_crash_calls_the_function_only_for_items_no_checkpoint_holds(tmp_path):
    ledger = tmp_path / "ledger"
    run_id = quote("map-crash", ledger, lines=50, concurrency=8, every=10)
    kept = {str(i): {"item": i, "price": i * 3} for i in range(0, 50, 2)}  # what the dead worker committed
    crash_after_intent(run_id, "quote_lines", progress={MAP_KEY: {"0": kept}})
    assert services.resume_due().counts() == {"completed": 1}
    assert sorted(i for _, i in calls(ledger)) == list(range(1, 50, 2))
    assert attempt_row(run_id, 2).result == {"lines": priced(50)}
    # The step's own progress never shows the maps' bookkeeping.
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_map_threads_use_connections_of_their_own_and_close_them(tmp_path):
    ledger = tmp_path / "ledger"
    run_id = quote("map-db", ledger, lines=24, concurrency=6, touch_db=True, item_seconds=0.01)

    def backends() -> set[int]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            return {row[0] for row in cursor.fetchall()}

    assert services.resume_due().counts() == {"completed": 1}
    lines = attempt_row(run_id, 1).result["lines"]
    used = {line["backend"] for line in lines}
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        mine = cursor.fetchone()[0]
    assert used and mine not in used  # never the run's connection (the engine's thread's)
    assert not used & backends()  # every thread closed its own when it ended
