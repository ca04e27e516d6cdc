"""The soak: 200 purchase orders (more if they drain before enough kills), two workers at once, each SIGKILLed at

Every kill is followed by a restart, as a supervisor would do; the far systems add a little latency and lose
one reply in a hundred (the effect happened, the caller never heard), so runs are left in doubt both by
kills and by the far systems themselves. Meanwhile staff cancel one run in ten, wherever it is, and abandon
every run that comes to wait for a person: those end unfinished and must give their stock reservation back,
under workers that keep dying. Beside them, WAITS runs of tests.workflows' `waiting` wait for a supplier's
confirmation that the soak sends (twice, as a retried webhook) at random moments, before or while they wait, and
parents with children (tests.faults.families) end each way: completed, failed, their approval rejected, their
escalation abandoned, cancelled by staff; completed children stay, a cancelled parent's napping child ends
cancelled and never books, a failed parent's children go on.
When every run has completed or been cancelled, the ledgers must hold exactly
one effect per key at the payment provider, the carrier, the portal, the warehouse (and the credit vendor),
the record and the ledgers must agree in both directions, and no run that ended unfinished still holds stock.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

import durableruns
from durableruns import services
from durableruns.errors import AlreadyDecided, RunNotActionable
from durableruns.models import Escalation, Intervention, RunEvent, RunState, RunStatus, RunStep
from project.purchasing.far import FarSystems
from tests.conftest import Workers, wait_until
from tests.faults.conftest import Report
from tests.faults import families as family
from tests.faults.pgbouncer import PgBouncer
from tests.faults.support import (
    ACTIVE,
    PLAN,
    PO_ENV,
    SYSTEM_OF,
    Worker,
    duplicates,
    leaked,
    ledger_view,
    matches_ledger,
    reference,
    spawn,
    start_purchase,
    total_effects,
)
from tests.logs import stray_tracebacks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.slow]

RUNS = 200
LINES = 30  # fewer lines than the real 240 keep the soak short; the loop still checkpoints (at 25)
SOAK_ENV = dict(PO_ENV, FAR_LATENCY="0.005", FAR_LOST_REPLY_RATE="0.01", PURCHASING_QUOTE_ITEM_SECONDS="0.002")
KILLING_FOR = 90.0  # seconds of random kills at most; then the survivors finish what is left
SETTLED = {RunStatus.COMPLETED, RunStatus.CANCELLED}
WAITS = 20  # runs that wait for an event the soak sends
MIN_LIFE = 1.5  # seconds a worker lives at least before the soak may kill it
MIN_KILLS = 10  # the kills the soak makes at least: on a fast machine the orders would drain before them
TOP_UP_BELOW, TOP_UP = 10, 20  # so, while it has not, fewer than 10 orders left bring 20 more
CANCELLED_EVERY = 10  # staff cancel runs 5, 15, 25, ... a third of the way into the kills


def confirm_some(waiting: list[str], rng: random.Random, k: int = 3) -> None:
    """A partner's webhook: confirm a few waiting runs (each with its key: a retry is recorded once)."""
    for run_id in rng.sample(waiting, k=min(k, len(waiting))):
        try:
            durableruns.send(run_id, "supplier_confirmed", {"ref": run_id}, key=f"{run_id}:webhook")
        except durableruns.errors.RunNotActionable:  # abandoned by staff meanwhile
            continue


def sent_for(far: FarSystems, run_id: str) -> int:
    return sum(e["payload"]["subject"] == f"{run_id}:confirmed" for e in far.email.effects())


def active() -> int:
    """Runs not settled yet: due, in hand, waiting, or waiting for a person (whom the soak plays: see below)."""
    return RunState.objects.filter(status__in=(*ACTIVE, RunStatus.NEEDS_DECISION)).count()


def abandon_waiting() -> set[str]:
    """Staff abandon every run that waits for a decision (on its notify_buyer: they will not check the outbox)."""
    abandoned = set()
    for escalation in Escalation.objects.open().filter(step="notify_buyer"):
        try:
            services.resolve_escalation(escalation.pk, "abandon", by="soak-staff", note="the buyer withdrew")
        except (AlreadyDecided, RunNotActionable):
            continue
        abandoned.add(escalation.run_id)
    return abandoned


def record_of(keys: set[str]) -> str:
    """What the record holds of each `run_id:step` in `keys`: its run's state and that step's attempts (who wrote
    them, how each ended, with what result), so that a soak that fails says how the step came to be completed."""
    lines = []
    for key in sorted(keys)[:5]:
        run_id, step = key.rsplit(":", 1)
        run = RunState.objects.filter(pk=run_id).values("status", "epoch", "owner", "reason").first()
        attempts = list(RunStep.objects.filter(run_id=run_id, step=step).order_by("attempt").values(
            "attempt", "status", "resolution", "owner", "epoch", "started_at", "finished_at", "result", "error"))
        lines.append(f"\n{key}: run {run}; attempts {attempts}")
    return "".join(lines)


def cancel_some(run_ids: list[str]) -> set[str]:
    """Staff cancel one run in ten wherever it stands (a completed one cannot be: it is left alone)."""
    cancelled = set()
    for run_id in run_ids[5::CANCELLED_EVERY]:
        try:
            services.cancel_run(run_id, by="soak-staff", note="the order was withdrawn")
        except RunNotActionable:
            continue
        cancelled.add(run_id)
    return cancelled


@pytest.mark.parametrize("concurrency", [1, 8], ids=["1-thread", "8-threads"])
def test_two_workers_killed_again_and_again_leave_one_effect_per_key(
    concurrency: int, far: FarSystems, workers: Workers, tmp_path: Path, fault_report: Report
) -> None:
    counts = soak(RUNS, KILLING_FOR, concurrency=concurrency, far=far, workers=workers, folder=tmp_path, waits=WAITS,
                  families=True)
    fault_report(f"soak with {concurrency} thread(s) per worker", counts)


def test_a_short_soak_through_pgbouncer_leaves_one_effect_per_key(
    far: FarSystems, workers: Workers, bouncer: PgBouncer, tmp_path: Path, fault_report: Report
) -> None:
    """The same soak, shorter, with every worker reaching the database through PgBouncer in transaction pooling."""
    counts = soak(60, 30.0, concurrency=2, far=far, workers=workers, folder=tmp_path,
                  route={"DATABASE_URL": bouncer.url})
    assert "prepared statement" not in bouncer.log()
    fault_report("soak through PgBouncer", counts)


def soak(runs: int, killing_for: float, *, concurrency: int, far: FarSystems, workers: Workers, folder: Path,
         route: dict[str, str] | None = None, waits: int = 0, families: bool = False) -> dict[str, int]:
    """Start `runs` orders and `waits` runs that wait for a supplier's confirmation, kill two workers at random
    for up to `killing_for` seconds (sending confirmations meanwhile, and more orders while the orders left run
    low before MIN_KILLS kills), let the survivors finish, and check the record and the ledgers; return the
    counts. `route` (DATABASE_URL): how the workers connect. With `families`, parents with children ended each
    way (tests.faults.families) run beside them, staff ending theirs as each comes to wait."""
    tmp_path = folder

    def orders(first: int, count: int) -> list[str]:
        return [start_purchase(f"PO-soak-{i:03d}", 1000 + i, lines=LINES) for i in range(first, first + count)]

    run_ids = orders(0, runs)
    waiting = [durableruns.start("waiting", {"total": 5, "cool_off": 0.3}, run_id=f"WAIT-soak-{i:02d}")
               for i in range(waits)]
    kin = family.start(f"soak-{concurrency}") if families else {}
    kin_runs = family.runs_of(kin)
    ended_by_staff: set[str] = set()
    # The workers load the probe, and tests.workflows where `waiting` and the families' workflows are declared.
    route = dict(route or {}, **({"DURABLERUNS_WORKFLOW_MODULES": "tests.faults.probe,tests.workflows"}
                                 if waits or families else {}))
    rng = random.Random(20260808)
    generation = 0

    def launch(slot: str) -> Worker:
        nonlocal generation
        generation += 1
        # -v 2: idle passes print their summary too, which is how the test knows the worker is up
        return spawn(workers, tmp_path, f"soak-{slot}-{generation}", "--loop", "--interval", "0.1",
                     "--lease", "1", "-v", "2", "--concurrency", str(concurrency), **{**SOAK_ENV, **route})

    slots = {"A": launch("A"), "B": launch("B")}
    born = dict.fromkeys(slots, time.monotonic())
    kills = 0
    abandoned: set[str] = set()
    cancelled: set[str] = set()
    began = time.monotonic()
    cancel_at = killing_for / 30
    while time.monotonic() - began < killing_for and (kills < MIN_KILLS or active()):
        if kills < MIN_KILLS and active() < TOP_UP_BELOW:
            run_ids += orders(len(run_ids), TOP_UP)
        abandoned |= abandon_waiting()
        family.end_those_ready(kin, ended_by_staff)
        confirm_some(waiting, rng)
        if cancel_at is not None and time.monotonic() - began >= cancel_at:
            cancelled, cancel_at = cancel_some(run_ids), None
        time.sleep(rng.uniform(0.2, 1.5) / (3 if concurrency > 1 else 1))  # 8 threads drain 3 times sooner
        slot = rng.choice(sorted(slots))
        # A worker lives long enough to load Django and claim work: killed sooner, on a loaded machine it would die
        # before its first claim again and again, and the soak would kill nothing in hand.
        time.sleep(max(0.0, born[slot] + MIN_LIFE - time.monotonic()))
        victim = slots[slot].proc
        if victim.poll() is None:
            victim.kill()  # SIGKILL, wherever it is: between commits, inside a far call, mid-loop
            victim.wait()
            kills += 1
        else:
            out, err = slots[slot].output()
            pytest.fail(f"worker {slot} exited by itself ({victim.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
        slots[slot] = launch(slot)
        born[slot] = time.monotonic()

    deadline = time.monotonic() + 120
    confirm_some(waiting, rng, k=len(waiting))  # every confirmation sent by now (again for most: recorded once)
    while active() and time.monotonic() < deadline:
        abandoned |= abandon_waiting()
        family.end_those_ready(kin, ended_by_staff)
        time.sleep(0.2)
    for worker in slots.values():  # SIGTERM ends --loop cleanly once the command has installed its handler
        wait_until(lambda: worker.out.stat().st_size > 0 or worker.proc.poll() is not None, what="a first pass")
        worker.proc.send_signal(signal.SIGTERM)
    for worker in slots.values():
        worker.proc.wait(timeout=30)
        out, err = worker.output()
        assert worker.proc.returncode == 0 and not stray_tracebacks(err), err[-4000:]

    # Every run completed, or was cancelled or abandoned by staff and gave back what it held; nobody waits.
    status = Counter(RunState.objects.exclude(pk__in=kin_runs).values_list("status", flat=True))
    assert set(status) <= SETTLED and sum(status.values()) == len(run_ids) + waits, status
    kin_counts = family.check(kin, far) if families else {}
    unfinished = set(RunState.objects.filter(status=RunStatus.CANCELLED).exclude(pk__in=kin_runs)
                     .values_list("run_id", flat=True))
    finished = [run_id for run_id in run_ids if run_id not in unfinished]
    assert Escalation.objects.open().count() == 0
    assert not RunState.objects.exclude(ending="").exists()
    assert set(Escalation.objects.exclude(run_id__in=kin_runs).values_list("step", flat=True)) <= {"notify_buyer"}

    # No step has two completed attempts; the completed steps of a run are a prefix of the plan.
    completed = Counter(RunStep.objects.filter(status="completed").values_list("run_id", "step"))  # families too
    assert max(completed.values()) == 1
    for run_id in run_ids:
        done = [step for step in PLAN if (run_id, step) in completed]
        if run_id in unfinished:
            assert tuple(done) == PLAN[: len(done)] and len(done) < len(PLAN), (run_id, done)
        else:
            assert tuple(done) == PLAN, (run_id, done)

    # The ledgers: exactly one effect per key at every keyed system, each key one of our runs' steps (or the
    # release of a reservation); every completed run has one per step.
    assert duplicates(far) == {}
    for step, system in SYSTEM_OF.items():
        by_key = {k: n for k, n in getattr(far, system).counts_by_key().items()
                  if not k.endswith(":release") and k.rsplit(":", 1)[0] not in kin_runs}  # (family.check's)
        assert set(by_key.values()) <= {1}, f"{system}: {by_key}"
        missing = {f"{run_id}:{step}" for run_id in finished} - set(by_key)
        assert not missing, f"{system}: {len(by_key)} keys; no effect for {sorted(missing)}: " + record_of(missing)
        assert set(by_key) <= {f"{run_id}:{step}" for run_id in run_ids}, f"{system}: keys of no run"

    # What was held is given back: no run that ended unfinished still holds a reservation; each reservation
    # of one was released once, by its own key, as its record says; a completed order keeps its stock.
    assert leaked(far, unfinished) == []
    releases = {r["key"]: r for r in far.warehouse.releases()}
    assert set(releases) <= {f"{run_id}:reserve_stock:release" for run_id in unfinished}
    released = RunStep.objects.filter(step="reserve_stock:release", status="completed")
    assert sorted(released.values_list("effect_key", flat=True)) == sorted(releases)
    for key, result in released.values_list("effect_key", "result"):
        assert result == far.warehouse.find_release(key), key
    held_keys = {r["key"] for r in far.warehouse.held()}
    assert held_keys == {f"{run_id}:reserve_stock" for run_id in finished}

    # The record agrees with the ledgers: every completed result is the effect the far system holds.
    rows = RunStep.objects.filter(status="completed", step__in=list(SYSTEM_OF)).values_list(
        "run_id", "step", "effect_key", "result")
    for run_id, step, key, result in rows:
        assert key == f"{run_id}:{step}"
        assert matches_ledger(step, result, ledger_view(far, step, key)), (run_id, step, result)

    # Each waiting run's confirmation was recorded once and consumed once, by its wait's one completed attempt;
    # the step after it saw the payload.
    for run_id in waiting:
        events = list(RunEvent.objects.filter(run_id=run_id))
        assert len(events) <= 1, run_id
        if run_id not in unfinished:
            (event,) = events
            assert (event.consumed_step, event.consumed_attempt) == ("supplier_confirmed", 1), run_id
            notified = RunStep.objects.get(run_id=run_id, step="notify_buyer", status="completed")
            assert notified.result["saw"] == {"ref": run_id}, run_id
            assert sent_for(far, run_id) == 1, run_id
        assert RunStep.objects.filter(run_id=run_id, step="supplier_confirmed", status="completed").count() <= 1

    # One email per completed run, at most one per run that ended unfinished, none twice.
    sent = Counter(e["payload"]["subject"] for e in far.email.effects())
    assert max(sent.values()) == 1
    for i, run_id in enumerate(run_ids):
        if run_id not in unfinished:
            assert sent[f"{reference(1000 + i)} has shipped"] == 1, run_id

    # The soak did what it says: workers died, and runs were really left in doubt and settled.
    left_in_doubt = RunStep.objects.filter(status="started").count()
    by_lookup = RunStep.objects.filter(resolution="lookup").count()
    assert kills >= MIN_KILLS and left_in_doubt + by_lookup > 0
    # Each run staff cancelled or abandoned ended cancelled, and no other run did.
    assert cancelled and not cancelled & abandoned and unfinished == cancelled | abandoned, {
        run_id: (RunState.objects.get(pk=run_id).status, run_id in cancelled, run_id in abandoned,
                 list(Intervention.objects.filter(run_id=run_id).values_list("action", "step", "decided_at")))
        for run_id in unfinished ^ (cancelled | abandoned) | cancelled & abandoned}
    return {"runs": len(run_ids), "waiting runs": waits, "kills": kills, "effects": total_effects(far),
            "duplicates": sum(map(len, duplicates(far).values())),
            "attempts left in doubt": left_in_doubt, "settled by lookup": by_lookup,
            "cancelled": len(cancelled), "abandoned": len(abandoned), "reservations released": len(releases),
            "holds leaked": len(leaked(far, unfinished)), **kin_counts}
