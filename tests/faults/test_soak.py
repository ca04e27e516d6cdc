"""The soak: 200 purchase orders, two workers at once, each SIGKILLed at random moments again and again.

Every kill is followed by a restart, as a supervisor would do; the far systems add a little latency and lose
one reply in a hundred (the effect happened, the caller never heard), so runs are left in doubt both by
kills and by the far systems themselves. When every run has completed or waits for a person, the ledgers must
hold exactly one effect per key at the payment provider, the carrier, the portal (and the credit vendor), and
the record and the ledgers must agree in both directions.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from durableruns.models import Escalation, RunState, RunStatus, RunStep
from project.purchasing.far import FarSystems
from tests.conftest import Workers, wait_until
from tests.faults.conftest import Report
from tests.faults.support import (
    ACTIVE,
    PLAN,
    PO_ENV,
    SYSTEM_OF,
    Worker,
    duplicates,
    ledger_view,
    matches_ledger,
    reference,
    spawn,
    start_purchase,
    total_effects,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.slow]

RUNS = 200
LINES = 30  # fewer lines than the real 240 keep the soak short; the loop still checkpoints (at 25)
SOAK_ENV = dict(PO_ENV, FAR_LATENCY="0.005", FAR_LOST_REPLY_RATE="0.01", PURCHASING_QUOTE_ITEM_SECONDS="0.002")
KILLING_FOR = 150.0  # seconds of random kills at most; then the survivors finish what is left
SETTLED = {RunStatus.COMPLETED, RunStatus.NEEDS_DECISION}


def active() -> int:
    return RunState.objects.filter(status__in=ACTIVE).count()


@pytest.mark.parametrize("concurrency", [1, 8], ids=["1-thread", "8-threads"])
def test_two_workers_killed_again_and_again_leave_one_effect_per_key(
    concurrency: int, far: FarSystems, workers: Workers, tmp_path: Path, fault_report: Report
) -> None:
    run_ids = [start_purchase(f"PO-soak-{i:03d}", 1000 + i, lines=LINES) for i in range(RUNS)]
    rng = random.Random(20260808)
    generation = 0

    def launch(slot: str) -> Worker:
        nonlocal generation
        generation += 1
        # -v 2: idle passes print their summary too, which is how the test knows the worker is up
        return spawn(workers, tmp_path, f"soak-{slot}-{generation}", "--loop", "--interval", "0.1",
                     "--lease", "1", "-v", "2", "--concurrency", str(concurrency), **SOAK_ENV)

    slots = {"A": launch("A"), "B": launch("B")}
    kills = 0
    began = time.monotonic()
    while active() and time.monotonic() - began < KILLING_FOR:
        time.sleep(rng.uniform(0.2, 1.5) / (3 if concurrency > 1 else 1))  # 8 threads drain 3 times sooner
        slot = rng.choice(sorted(slots))
        victim = slots[slot].proc
        if victim.poll() is None:
            victim.kill()  # SIGKILL, wherever it is: between commits, inside a far call, mid-loop
            victim.wait()
            kills += 1
        else:
            out, err = slots[slot].output()
            pytest.fail(f"worker {slot} exited by itself ({victim.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
        slots[slot] = launch(slot)

    deadline = time.monotonic() + 120
    while active() and time.monotonic() < deadline:
        time.sleep(0.2)
    for worker in slots.values():  # SIGTERM ends --loop cleanly once the command has installed its handler
        wait_until(lambda: worker.out.stat().st_size > 0 or worker.proc.poll() is not None, what="a first pass")
        worker.proc.send_signal(signal.SIGTERM)
    for worker in slots.values():
        worker.proc.wait(timeout=30)
        out, err = worker.output()
        assert worker.proc.returncode == 0 and "Traceback" not in err, err[-4000:]

    # Every run completed or waits for a person; only notify_buyer (escalate) ever waits.
    status = Counter(RunState.objects.values_list("status", flat=True))
    assert set(status) <= SETTLED and sum(status.values()) == RUNS, status
    waiting = list(RunState.objects.filter(status=RunStatus.NEEDS_DECISION).values_list("run_id", flat=True))
    assert sorted(Escalation.objects.open().values_list("run_id", flat=True)) == sorted(waiting)
    assert set(Escalation.objects.values_list("step", flat=True)) <= {"notify_buyer"}

    # No step has two completed attempts; the completed steps of a run are a prefix of the plan.
    completed = Counter(RunStep.objects.filter(status="completed").values_list("run_id", "step"))
    assert max(completed.values()) == 1
    for run_id in run_ids:
        done = [step for step in PLAN if (run_id, step) in completed]
        expected = PLAN if run_id not in waiting else PLAN[:-1]
        assert tuple(done) == expected, (run_id, done)

    # The ledgers: exactly one effect per key at every keyed system, and each key is one of our runs' steps.
    assert duplicates(far) == {}
    for step, system in SYSTEM_OF.items():
        by_key = getattr(far, system).counts_by_key()
        assert by_key == {f"{run_id}:{step}": 1 for run_id in run_ids}, f"{system}: {len(by_key)} keys"

    # The record agrees with the ledgers: every completed result is the effect the far system holds.
    rows = RunStep.objects.filter(status="completed", step__in=list(SYSTEM_OF)).values_list(
        "run_id", "step", "effect_key", "result")
    for run_id, step, key, result in rows:
        assert key == f"{run_id}:{step}"
        assert matches_ledger(step, result, ledger_view(far, step, key)), (run_id, step, result)

    # One email per completed run, at most one per run waiting for a decision, none twice.
    sent = Counter(e["payload"]["subject"] for e in far.email.effects())
    assert max(sent.values()) == 1
    for i, run_id in enumerate(run_ids):
        if run_id not in waiting:
            assert sent[f"{reference(1000 + i)} has shipped"] == 1, run_id

    # The soak did what it says: workers died, and runs were really left in doubt and settled.
    left_in_doubt = RunStep.objects.filter(status="started").count()
    by_lookup = RunStep.objects.filter(resolution="lookup").count()
    assert kills >= 10 and left_in_doubt + by_lookup > 0
    fault_report(f"soak with {concurrency} thread(s) per worker", {
                          "runs": RUNS, "kills": kills, "effects": total_effects(far),
                          "duplicates": sum(map(len, duplicates(far).values())),
                          "attempts left in doubt": left_in_doubt, "settled by lookup": by_lookup,
                          "escalated": len(waiting)})
