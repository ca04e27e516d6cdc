"""ctx.map under SIGKILL: a worker killed in the middle of 240 items; the resumed step calls the function only
for the items its checkpoints do not hold (at most `every` + `concurrency` of them again), and the results are
complete and in item order. Every call is counted in a ledger file, written by the mapped function itself."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from durableruns import services
from durableruns.context import MAP_KEY
from durableruns.models import RunStep
from tests.conftest import Workers
from tests.faults.support import settle

pytestmark = pytest.mark.django_db(transaction=True)

LINES, EVERY, CONCURRENCY = 240, 25, 16


def test_a_worker_killed_mid_map_is_resumed_calling_only_the_unfinished_items(workers: Workers, tmp_path: Path):
    ledger = tmp_path / "ledger"
    run_id = services.start_run(
        "mapping",
        {"ledger": str(ledger), "lines": LINES, "every": EVERY, "concurrency": CONCURRENCY, "item_seconds": 0.02},
        run_id="map-killed",
    )
    # 1. The worker dies (SIGKILL, from the step's own thread) as the 130th result is collected.
    doomed = workers.start("--run", run_id, "--lease", "1", "--worker", "doomed",
                           DURABLERUNS_CRASH_AT="quote_lines@map:130")
    out, err = doomed.communicate(timeout=60)
    assert doomed.returncode == -9, f"the worker was not killed (exit {doomed.returncode}):\n{out}{err}"
    first = RunStep.objects.get(run_id=run_id, step="quote_lines", attempt=1)
    kept = {int(i) for i in first.progress[MAP_KEY]["0"]}
    assert first.status == "started" and len(kept) == 125  # the last checkpoint: 5 x every
    calls = [line.split() for line in ledger.read_text().splitlines()]
    before = {int(i) for _, a, i in calls if a == "1"}
    assert kept < before and len(before) < LINES

    # 2. Another worker resumes the run in doubt (re-executable: a new attempt from the last checkpoint).
    settle(workers, [run_id], {}, folder=tmp_path / "resume")
    calls = [line.split() for line in ledger.read_text().splitlines()]
    after = [int(i) for _, a, i in calls if a == "2"]
    assert sorted(after) == sorted(set(range(LINES)) - kept)  # only what no checkpoint held, each once
    again = before & set(after)
    assert len(again) <= EVERY + CONCURRENCY, f"{len(again)} items called twice"
    counts = Counter(int(i) for _, _, i in calls)
    assert set(counts) == set(range(LINES)) and max(counts.values()) <= 2
    second = RunStep.objects.get(run_id=run_id, step="quote_lines", attempt=2)
    assert second.status == "completed"
    assert second.result == {"lines": [{"item": i, "price": i * 3} for i in range(LINES)]}
    print(f"map under SIGKILL: {len(before)} items started before the kill, 125 checkpointed, {len(again)} again")
