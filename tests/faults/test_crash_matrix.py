"""The crash matrix: a real worker process SIGKILLed at every point of the step cycle, for every policy.

For each step of the purchase order under test (quote: re_executable; credit_check, reserve_stock, charge,
place_order, book_shipment: resolvable; notify_buyer: escalate) one run per kill point is started and a worker
working only that run is armed to die there (DURABLERUNS_CRASH_AT), all at once. The probe log proves each died exactly
where it was armed. Then one resume_runs worker settles every run, staff decide the escalations the way the
step's docstring says (look in the outbox), and the record and the far systems' ledgers are checked:

- nothing is lost: every run completes; each step has one completed attempt and only the step that was in
  doubt has more than one attempt, exactly as its policy prescribes;
- nothing is done twice: one effect per key at the portal, the payment provider, the carrier, the warehouse and
  the credit vendor (which does not deduplicate: we did), and one email per run;
- a loop redoes at most `every` items, counted item by item by the probe.

A kill "before_intent" of a step lands after the previous step returned and before their shared commit, so the
step in doubt is the previous one; the cases below say which step each kill leaves in doubt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db.models.functions import Now

import durableruns
from durableruns import services
from durableruns.models import Escalation, Intervention, RunState, RunStatus, RunStep
from project.purchasing.far import FarSystems
from tests.conftest import Workers, wait_until
from tests.faults import families as family
from tests.faults.conftest import Report
from tests.faults.pgbouncer import PgBouncer
from tests.faults.support import (
    LOOP_EVERY,
    PLAN,
    PO_ENV,
    POLICY,
    SYSTEM_OF,
    Probe,
    duplicates,
    ledger_view,
    matches_ledger,
    reference,
    settle,
    start_purchase,
    total_effects,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.slow]

LINES = 240  # the quote step's 240 line items, checkpointed every 25
CYCLE = ("before_intent", "after_intent", "after_effect", "after_return")
POINTS: dict[str, tuple[str, ...]] = {
    # quote has no far effect; its loop is killed between checkpoints instead (never at a multiple of 25)
    "quote": ("before_intent", "after_intent", "loop:7", "loop:173", "loop:239", "after_return"),
    "credit_check": CYCLE,
    "reserve_stock": CYCLE,
    "charge": CYCLE,
    "place_order": CYCLE,
    "book_shipment": CYCLE,
    "notify_buyer": CYCLE,
}


@dataclass(frozen=True)
class Case:
    """One kill: the step and point armed, and what the record holds in doubt afterwards."""

    n: int
    step: str
    point: str

    @property
    def run_id(self) -> str:
        return f"PO-matrix-{self.step}-{self.point.replace(':', '')}"

    @property
    def in_doubt(self) -> str:
        """The step a kill here leaves in doubt: before_intent is before the previous step's result commit."""
        return PLAN[PLAN.index(self.step) - 1] if self.point == "before_intent" else self.step

    @property
    def effect_happened(self) -> bool:
        """Whether the in-doubt step had already acted at the far system when the worker died."""
        return self.point in ("before_intent", "after_effect", "after_return")

    def quote_items_at_kill(self) -> int:
        """Quote items the killed worker had finished."""
        if self.point.startswith("loop:"):
            return int(self.point.split(":")[1])
        if self.step == "quote":
            return LINES if self.point == "after_return" else 0
        return LINES if PLAN.index(self.step) > PLAN.index("quote") else 0

    def expected_redo(self) -> int:
        """Items the resume must price again: those after the last checkpoint (a quote in doubt only)."""
        if self.in_doubt != "quote":
            return 0
        items = self.quote_items_at_kill()
        checkpoint = min(items // LOOP_EVERY * LOOP_EVERY, (LINES - 1) // LOOP_EVERY * LOOP_EVERY)
        return items - checkpoint


def attempts(run_id: str, step: str) -> list[tuple[int, str, str]]:
    rows = RunStep.objects.filter(run_id=run_id, step=step).order_by("attempt")
    return list(rows.values_list("attempt", "status", "resolution"))


def outbox(far: FarSystems, run_n: int) -> list[dict[str, Any]]:
    subject = f"{reference(run_n)} has shipped"
    return [e for e in far.email.effects() if e["payload"]["subject"] == subject]


@pytest.mark.parametrize("concurrency", [1, 8], ids=["1-thread", "8-threads"])
@pytest.mark.parametrize("step", list(POINTS), ids=[f"{POLICY[s]}-{s}" for s in POINTS])
def test_a_worker_killed_at_any_point_loses_nothing_and_does_nothing_twice(
    step: str, concurrency: int, far: FarSystems, workers: Workers, tmp_path: Path, fault_report: Report
) -> None:
    base = 100 + 10 * list(POINTS).index(step)
    cases = [Case(n=base + i, step=step, point=point) for i, point in enumerate(POINTS[step])]
    counts = kill_and_settle(cases, concurrency=concurrency, far=far, workers=workers, folder=tmp_path)
    fault_report(f"crash matrix with {concurrency} thread(s) per worker", counts)


# The core of the matrix through PgBouncer: every policy, each killed after its intent and after its effect (the
# quote, which has no far effect, mid-loop instead).
CORE = {"quote": ("after_intent", "loop:173"), "charge": ("after_intent", "after_effect"),
        "notify_buyer": ("after_intent", "after_effect")}


def test_through_pgbouncer_a_killed_worker_loses_nothing_and_does_nothing_twice(
    far: FarSystems, workers: Workers, bouncer: PgBouncer, tmp_path: Path, fault_report: Report
) -> None:
    """Every worker reaches the database through PgBouncer in transaction pooling, with durableruns' defaults
    (prepared statements on, the LISTEN on the runs' alias): nothing prepared breaks, and the record holds."""
    cases = [Case(n=500 + 10 * i + j, step=step, point=point)
             for i, (step, points) in enumerate(CORE.items()) for j, point in enumerate(points)]
    counts = kill_and_settle(cases, concurrency=4, far=far, workers=workers, folder=tmp_path,
                             route={"DATABASE_URL": bouncer.url})
    assert "prepared statement" not in bouncer.log()
    fault_report("crash matrix through PgBouncer", counts)


def kill_and_settle(cases: list[Case], *, concurrency: int, far: FarSystems, workers: Workers, folder: Path,
                    route: dict[str, str] | None = None) -> dict[str, int]:
    """Start each case's run, kill a worker at its point, settle and decide, and check that nothing was lost or
    done twice; return the counts. `route` (DATABASE_URL) is how the workers reach the database."""
    tmp_path = folder
    for case in cases:
        start_purchase(case.run_id, case.n, lines=LINES)
    probe = Probe(tmp_path / "probe.log")
    env = dict(PO_ENV, **probe.env(), **(route or {}))

    # 1. One worker per run, all at once, each armed to die at its point.
    crashers = {
        case: workers.start("--run", case.run_id, "--lease", "1", "--worker", f"doomed-{case.point}",
                            "--concurrency", str(concurrency),
                            DURABLERUNS_CRASH_AT=f"{case.step}@{case.point}", **env)
        for case in cases
    }
    for case, proc in crashers.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == -9, f"{case}: the worker was not killed (exit {proc.returncode}):\n{out}{err}"
        assert probe.last_point(proc.pid) == (case.point, case.step), f"{case}: died elsewhere"

    # 2. What the record says after the kill: exactly the expected step in doubt; the far system agrees.
    for case in cases:
        b = durableruns.boundary(case.run_id)
        assert b.in_doubt == [case.in_doubt], f"{case}: {b}"
        assert b.done == list(PLAN[: PLAN.index(case.in_doubt)]), f"{case}: {b}"
        if case.in_doubt in SYSTEM_OF:
            effects = getattr(far, SYSTEM_OF[case.in_doubt]).effects(f"{case.run_id}:{case.in_doubt}")
            assert len(effects) == int(case.effect_happened), f"{case}: {effects}"

    # 3. Resume until every run completed or waits for a person.
    settle(workers, [c.run_id for c in cases], env, folder=tmp_path, concurrency=concurrency)
    for case in cases:
        run = RunState.objects.get(pk=case.run_id)
        if case.in_doubt == "notify_buyer":
            assert run.status == RunStatus.NEEDS_DECISION, f"{case}: {run.status} {run.reason}"
            escalation = Escalation.objects.open().get(run_id=case.run_id)
            assert (escalation.step, escalation.attempt) == ("notify_buyer", 1)
            assert len(outbox(far, case.n)) == int(case.effect_happened), f"{case}: the escalation held the email"
        else:
            assert run.status == RunStatus.COMPLETED, f"{case}: {run.status} {run.reason}"

    # 4. A person decides each escalation by looking in the sender's outbox (the step's docstring), then resume.
    number = {case.run_id: case.n for case in cases}
    for escalation in Escalation.objects.open():
        sent = outbox(far, number[escalation.run_id])
        if sent:
            message = sent[0]
            durableruns.decide(escalation.run_id, "notify_buyer", "happened", by="alice", note="it is in the outbox",
                               result={"message_id": f"msg_{message['id']}", **message["payload"]})
        else:
            durableruns.decide(escalation.run_id, "notify_buyer", "did_not_happen", by="alice",
                               note="no message in the outbox")
    if Intervention.objects.exists():
        settle(workers, [c.run_id for c in cases], env, folder=tmp_path, concurrency=concurrency)

    # 5. Nothing lost, nothing twice, and each in-doubt step settled exactly as its policy prescribes.
    for case in cases:
        assert RunState.objects.get(pk=case.run_id).status == RunStatus.COMPLETED, case
        for name in PLAN:
            rows = attempts(case.run_id, name)
            if name != case.in_doubt:
                assert [(a, s) for a, s, _ in rows] == [(1, "completed")], f"{case}: {name} ran again: {rows}"
                continue
            policy = POLICY[name]
            if policy == "re_executable" or not case.effect_happened:
                assert [(a, s) for a, s, _ in rows] == [(1, "started"), (2, "completed")], f"{case}: {rows}"
            elif policy == "resolvable":
                assert rows == [(1, "completed", "lookup")], f"{case}: {rows}"
            else:
                assert rows == [(1, "completed", "decision")], f"{case}: {rows}"
        keys = RunStep.objects.filter(run_id=case.run_id).values_list("step", "effect_key").distinct()
        assert all(key == f"{case.run_id}:{name}" for name, key in keys), f"{case}: keys changed: {list(keys)}"
        for name in SYSTEM_OF:
            key = f"{case.run_id}:{name}"
            assert len(getattr(far, SYSTEM_OF[name]).effects(key)) == 1, f"{case}: {name} effects under {key}"
            result = RunStep.objects.get(run_id=case.run_id, step=name, status="completed").result
            assert matches_ledger(name, result, ledger_view(far, name, key)), f"{case}: {name} disagrees"
        assert len(outbox(far, case.n)) == 1, f"{case}: emails sent"
        priced = probe.loop_items(case.run_id)
        assert priced - LINES == case.expected_redo() <= LOOP_EVERY, f"{case}: priced {priced} items"

    assert duplicates(far) == {}
    assert far.email.count() == len(cases)
    assert Escalation.objects.open().count() == 0
    return {"cases": len(cases), "kills": len(crashers), "runs": len(cases), "effects": total_effects(far),
            "duplicates": sum(map(len, duplicates(far).values()))}


RELEASE = "reserve_stock:release"


@pytest.mark.parametrize("concurrency", [1, 8], ids=["1-thread", "8-threads"])
def test_a_worker_killed_at_any_point_of_a_release_gives_the_stock_back_once(
    concurrency: int, far: FarSystems, workers: Workers, tmp_path: Path, fault_report: Report
) -> None:
    """Orders abandoned in the queue give their stock reservation back; the worker releasing each is killed at a
    point of the release's cycle, and the resume releases it with no second release at the warehouse."""
    cases = {f"PO-matrix-release-{point}": point for point in CYCLE}
    for i, run_id in enumerate(cases):
        start_purchase(run_id, 300 + i, lines=30)
    probe = Probe(tmp_path / "probe.log")
    env = dict(PO_ENV, **probe.env())

    # 1. Each order's worker dies just before emailing the buyer: the order waits in the queue, holding its stock.
    for run_id in cases:
        proc = workers.start("--run", run_id, "--lease", "1", "--worker", "doomed-notify",
                             DURABLERUNS_CRASH_AT="notify_buyer@after_intent", **env)
        proc.communicate(timeout=60)
        assert proc.returncode == -9, run_id
    settle(workers, list(cases), env, folder=tmp_path, concurrency=concurrency)
    for run_id in cases:
        assert RunState.objects.get(pk=run_id).status == RunStatus.NEEDS_DECISION
        assert len(far.warehouse.held()) == len(cases)

    # 2. Staff abandon each; the act only marks the run: nothing is released yet.
    for run_id in cases:
        durableruns.decide(run_id, "notify_buyer", "abandon", by="alice", note="the buyer withdrew")
        run = RunState.objects.get(pk=run_id)
        assert (run.status, run.ending) == (RunStatus.PENDING, RunStatus.CANCELLED)
    assert far.warehouse.releases() == []

    # 3. One worker per order, each armed to die at its point of the release's cycle.
    crashers = {
        run_id: workers.start("--run", run_id, "--lease", "1", "--worker", f"doomed-{point}",
                              "--concurrency", str(concurrency), DURABLERUNS_CRASH_AT=f"{RELEASE}@{point}", **env)
        for run_id, point in cases.items()
    }
    for run_id, proc in crashers.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == -9, f"{run_id}: not killed (exit {proc.returncode}):\n{out}{err}"
        assert probe.last_point(proc.pid) == (cases[run_id], RELEASE), f"{run_id}: died elsewhere"
        released = far.warehouse.find_release(f"{run_id}:{RELEASE}")
        assert (released is not None) == (cases[run_id] in ("after_effect", "after_return")), run_id

    # 4. Resume: each release completes once, the run is cancelled, and the warehouse holds none of their stock.
    settle(workers, list(cases), env, folder=tmp_path, concurrency=concurrency)
    for run_id, point in cases.items():
        run = RunState.objects.get(pk=run_id)
        assert (run.status, run.ending) == (RunStatus.CANCELLED, ""), f"{run_id}: {run.status} {run.reason}"
        rows = [(a, s) for a, s, _ in attempts(run_id, RELEASE)]
        assert rows == ([(1, "completed")] if point == "before_intent" else [(1, "started"), (2, "completed")])
        assert len(far.warehouse.effects(f"{run_id}:{RELEASE}")) == 1, run_id
        result = RunStep.objects.get(run_id=run_id, step=RELEASE, status="completed").result
        assert result == far.warehouse.find_release(f"{run_id}:{RELEASE}"), run_id
    assert far.warehouse.held() == [] and len(far.warehouse.releases()) == len(cases)
    assert duplicates(far) == {}
    fault_report(f"release crash matrix with {concurrency} thread(s) per worker", {
        "cases": len(cases), "kills": len(crashers), "releases": len(far.warehouse.releases()),
        "holds leaked": len(far.warehouse.held())})


# -- a far call that lands late ----------------------------------------------------------------------------
#
# A worker makes its far call, then dies; the far system commits the call only later, inside the call's timeout.
# Until then a lookup by key says "not found", and that is lateness, not absence: the dead worker may have called
# at any moment until the lease it last held ran out. Each path that settles an in-doubt step must wait until
# that lease's end + the timeout + the lag, read from the record, and never call again meanwhile: a later pass,
# `resume_runs --run`, a run staff moved with adopt_plan, and a cancel settling the acquisition it gives back.

LATE_PATHS = ("later_pass", "run_flag", "adopt_plan", "cancel", "later_pass_ungated")


@dataclass(frozen=True)
class LateCase:
    path: str
    renewed: bool  # the heartbeat renewed the lease once before the call: a renewal does not end the window

    @property
    def run_id(self) -> str:
        return f"late-{self.path}-{'renewed' if self.renewed else 'never-renewed'}"


def test_a_far_call_that_lands_late_is_not_made_twice_on_any_path(
    far: FarSystems, workers: Workers, tmp_path: Path
) -> None:
    from durableruns import services
    from durableruns.clock import Clock
    from tests.faults import late_far
    from tests.faults.support import settle

    gate = tmp_path / "gate"
    cases = [LateCase(path, renewed) for path in LATE_PATHS for renewed in (False, True)]
    late_far.declare("v1")
    for case in cases:
        services.start_run("late_pay", {"after_renewal": case.renewed, "work": 1.0,
                                        "gate": "" if case.path.endswith("ungated") else str(gate)},
                           run_id=case.run_id)
    env = {"DURABLERUNS_WORKFLOW_MODULES": "tests.faults.late_far", "LATE_PAY_DEPLOY": "v2",
           "DURABLERUNS_RETRY_BACKOFF_SECONDS": "0"}

    # 1. One worker per run, each killed right after its call left: before any renewal of a 6 s lease, or after
    #    one renewal of a 4 s lease (renewed every 1.3 s: its 1 s of work ends before the next).
    doomed = {case: workers.start("--run", case.run_id, "--lease", "4" if case.renewed else "6",
                                  "--worker", f"doomed-{case.run_id}", DURABLERUNS_CRASH_AT="pay@after_effect", **env)
              for case in cases}
    for case, proc in doomed.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == -9, f"{case}: the worker was not killed (exit {proc.returncode}):\n{out}{err}"
    rows = {case: RunStep.objects.get(run_id=case.run_id, step="pay", attempt=1) for case in cases}
    for case, row in rows.items():
        assert (row.renewed_at is not None) is case.renewed, (case, row.renewed_at)
        assert row.held_until is not None and row.raised_at is None
    until = {case: row.held_until + late_far.TIMEOUT for case, row in rows.items()}  # + lag 0

    # 2. Every lease has run out; no far commit has landed (the gate is shut, the ungated land 29.5 s after the
    #    call). Each path looks up, finds nothing, and waits until the bound from the record.
    while Clock().now() <= max(row.held_until for row in rows.values()):
        time.sleep(0.05)
    late_far.declare("v2")
    for case in cases:
        if case.path == "adopt_plan":
            services.adopt_plan(case.run_id, by="staff", note="the thank-you step ships today")
        if case.path == "cancel":
            services.cancel_run(case.run_id, by="staff", note="the buyer withdrew the order")
    by_run = [workers.start("--run", case.run_id, "--once", "--worker", f"by-run-{case.run_id}", **env)
              for case in cases if case.path in ("run_flag", "adopt_plan", "cancel")]
    for proc in by_run:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"{out}\n{err}"
    cron = workers.run("--once", "--worker", "cron", **env)
    assert cron.returncode == 0, f"{cron.stdout}\n{cron.stderr}"
    assert far.carrier.count() == 0, "a far commit landed before the lookups: the test proves nothing"
    for case in cases:
        state = RunState.objects.get(pk=case.run_id)
        assert state.status == RunStatus.WAITING, (case, state.status, state.reason)
        assert state.wake_at == until[case], (case, state.wake_at, until[case])
        assert list(RunStep.objects.filter(run_id=case.run_id, step="pay").values_list("attempt", "status")) == [
            (1, "started")], case

    # 3. The far commits land (the gated now, the ungated at the latest moment inside the call's timeout); the
    #    runs wake at their bounds and find each booking by its key.
    gate.touch()
    settle(workers, [case.run_id for case in cases], env, folder=tmp_path / "settle", timeout=60)
    assert far.carrier.duplicates() == {}, far.carrier.counts_by_key()
    for case in cases:
        key = f"{case.run_id}:pay"
        assert len(far.carrier.effects(key)) == 1, case
        pay = list(RunStep.objects.filter(run_id=case.run_id, step="pay").values_list("status", "resolution"))
        assert pay == [("completed", "lookup")], (case, pay)
        state = RunState.objects.get(pk=case.run_id)
        if case.path == "cancel":
            assert state.status == RunStatus.CANCELLED and late_far.released(case.run_id) == [f"{key}:release"]
        else:
            assert state.status == RunStatus.COMPLETED, (case, state.status, state.reason)


# Parents with children, ended each way (issue 30, tests.faults.families): a worker killed where a parent starts
# its children (asked for, not committed) and where a child books (its intent recorded; its booking made and its
# result not), then one worker settles them while staff end the parents.
FAMILY_KILLS = (("start_nappers", "after_return"), ("book_after_nap", "after_intent"),
                ("book_after_nap", "after_return"))


def test_a_parent_with_children_ended_each_way_under_kills_makes_no_effect_twice(
    far: FarSystems, workers: Workers, tmp_path: Path, fault_report: Report
) -> None:
    started = time.monotonic()
    families = family.start("matrix")
    for step, point in FAMILY_KILLS:
        # One worker draining what is due; it dies the first time any run reaches the point.
        crashed = workers.run("--once", "--lease", "1", "--worker", f"doomed-{step}-{point}", timeout=60,
                              DURABLERUNS_CRASH_AT=f"{step}@{point}",
                              DURABLERUNS_CRASH_MARKER=str(tmp_path / f"{step}-{point}"))
        assert crashed.returncode == -9, f"{step}@{point}: not killed (exit {crashed.returncode}):\n{crashed.stderr}"
        time.sleep(1.1)  # its lease runs out
    settler = workers.start("--loop", "--lease", "1", "--interval", "0.2", "--worker", "settler")
    acted: set[str] = set()
    deadline = time.monotonic() + 90
    while not (family.settled(families) and len(acted) == 3):
        assert time.monotonic() < deadline and settler.poll() is None, list(
            RunState.objects.filter(pk__in=family.runs_of(families)).values_list("run_id", "status", "reason"))
        family.end_those_ready(families, acted)
        time.sleep(0.2)
    settler.kill()
    counts = family.check(families, far)
    assert not far.carrier.duplicates()
    in_doubt = RunStep.objects.filter(run_id__in=family.runs_of(families), status="started").count()
    fault_report("crash matrix: parents with children ended each way",
                 {**counts, "kills": len(FAMILY_KILLS), "attempts left in doubt": in_doubt,
                  "seconds": round(time.monotonic() - started)})


# Results held for a later commit (issue 34, durableruns.held): tests.workflows.chained, whose price_1..3 record no
# intent and share one commit between reserve and confirm (both resolvable, with intents), killed at each point of
# the chain. Per kill: what the record holds afterwards (done, in doubt) and how often each price step has run once
# the resume is over: every step of the chain not yet committed runs again (it has no effect: that is why it may
# wait), and reserve and confirm act once each.
CHAIN_KILLS: dict[tuple[str, str], tuple[list[str], list[str], tuple[int, int, int]]] = {
    ("price_1", "after_intent"): (["reserve"], [], (1, 1, 1)),  # recorded no intent: the moment before its call
    ("price_2", "after_return"): (["reserve"], [], (2, 2, 1)),  # price_1's result held, price_2's returned
    ("price_2", "result_held"): (["reserve"], [], (2, 2, 1)),  # both held
    ("price_3", "after_return"): (["reserve"], [], (2, 2, 2)),
    ("confirm", "before_intent"): (["reserve"], [], (2, 2, 2)),  # the chain's commit carries confirm's intent
    ("confirm", "after_intent"): (["reserve", "price_1", "price_2", "price_3"], ["confirm"], (1, 1, 1)),
}


def test_a_worker_killed_inside_a_chain_of_held_results_redoes_the_chain_and_no_effect(
    workers: Workers, tmp_path: Path, fault_report: Report
) -> None:
    probe = Probe(tmp_path / "probe.log")
    env = {**PO_ENV, **probe.env(), "DURABLERUNS_WORKFLOW_MODULES": "tests.workflows,tests.faults.probe",
           "DURABLERUNS_HOLD_RESULTS_SECONDS": "30"}  # a loaded machine never ends a chain early
    ledger = tmp_path / "ledger"
    runs = {}
    for (step, point), expected in CHAIN_KILLS.items():
        calls = tmp_path / f"calls-{step}-{point}"
        run_id = durableruns.start("chained", {"calls": str(calls), "ledger": str(ledger)},
                                   run_id=f"chain-{step}-{point}")
        runs[run_id] = (step, point, calls, expected)

    # 1. One worker per run, all at once, each armed to die at its point.
    crashers = {run_id: workers.start("--run", run_id, "--lease", "1", "--worker", f"doomed-{run_id}",
                                      DURABLERUNS_CRASH_AT=f"{step}@{point}", **env)
                for run_id, (step, point, _, _) in runs.items()}
    for run_id, proc in crashers.items():
        out, err = proc.communicate(timeout=60)
        step, point = runs[run_id][:2]
        assert proc.returncode == -9, f"{run_id}: the worker was not killed (exit {proc.returncode}):\n{out}{err}"
        assert probe.last_point(proc.pid) == (point, step), f"{run_id}: died elsewhere"

    # 2. The record after the kill: nothing of the chain before its commit, nothing of it in doubt.
    for run_id, (_, _, _, (done, in_doubt, _)) in runs.items():
        b = durableruns.boundary(run_id)
        assert (b.done, b.in_doubt) == (done, in_doubt), f"{run_id}: {b}"

    # 3. The resume: every run completes; the chain ran again as far as it was lost; each far effect once.
    settle(workers, list(runs), env, folder=tmp_path)
    booked = ledger.read_text().split()
    for run_id, (_, _, calls, (_, _, ran)) in runs.items():
        run = RunState.objects.get(pk=run_id)
        assert run.status == RunStatus.COMPLETED, f"{run_id}: {run.status} {run.reason}"
        names = [line.split()[0] for line in calls.read_text().splitlines()]
        assert tuple(names.count(f"price_{n}") for n in (1, 2, 3)) == ran, f"{run_id}: {names}"
        assert booked.count(f"{run_id}:reserve") == booked.count(f"{run_id}:confirm") == 1, f"{run_id}: {booked}"
        totals = [RunStep.objects.get(run_id=run_id, step=f"price_{n}", status="completed").result["total"]
                  for n in (1, 2, 3)]
        assert totals == [1, 3, 6], f"{run_id}: {totals}"
    fault_report("crash matrix inside a chain of held results",
                 {"kills": len(crashers), "runs": len(runs), "effects": len(booked)})


def test_a_chain_of_held_results_that_kills_its_worker_every_time_stops_for_staff_at_the_crash_budget(
    workers: Workers, tmp_path: Path, fault_report: Report
) -> None:
    """A step declared intent=False whose call kills its worker (an out-of-memory kill, a crash in native code)
    leaves nothing recorded, so no attempt in doubt counts against the crash budget; the claims count the
    takeovers instead. Each worker here is SIGKILLed after price_2 returns, its result and price_1's held: the run
    is taken over again only until DURABLERUNS_MAX_CRASHES, then stopped for staff, the chain not run again and
    no worker killed by it again; a staff retry gives it a fresh count and it completes."""
    probe = Probe(tmp_path / "probe.log")
    budget = 2
    env = {**probe.env(), "DURABLERUNS_WORKFLOW_MODULES": "tests.workflows,tests.faults.probe",
           "DURABLERUNS_HOLD_RESULTS_SECONDS": "30", "DURABLERUNS_MAX_CRASHES": str(budget)}
    calls = tmp_path / "calls"
    run_id = durableruns.start("pure_chain", {"calls": str(calls)}, run_id="poison-chain")
    killed = 0
    for _ in range(budget + 2):  # a worker a try, each armed to die where the last one did
        wait_until(lambda: not RunState.objects.filter(pk=run_id, status=RunStatus.RUNNING,
                                                       lease_expires_at__gt=Now()).exists(),
                   timeout=30, every=0.1, what="the dead worker's lease to run out")
        proc = workers.start("--once", "--lease", "1", DURABLERUNS_CRASH_AT="price_2@after_return", **env)
        out, err = proc.communicate(timeout=60)
        if proc.returncode != -9:
            assert proc.returncode == 0, out + err
            break
        assert probe.last_point(proc.pid) == ("after_return", "price_2"), "died elsewhere"
        killed += 1
    run = RunState.objects.get(pk=run_id)
    assert killed == budget, f"{killed} workers killed; the run is {run.status}: {run.reason}"
    assert run.status == RunStatus.NEEDS_DECISION, run.reason
    assert f"died {budget} times in a row at price_1" in run.reason, run.reason
    names = [line.split()[0] for line in calls.read_text().splitlines()]
    assert (names.count("price_1"), names.count("price_2"), names.count("price_3")) == (budget, budget, 0), names
    assert not RunStep.objects.filter(run_id=run_id).exists()  # nothing of the chain was ever committed
    services.retry_run(run_id, by="ops", note="the host had too little memory; it has more now")
    settle(workers, [run_id], env, folder=tmp_path)
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, run.reason
    fault_report("a chain of held results that kills its worker every time", {"kills": killed, "budget": budget})
