"""Concurrency limits and durableruns.result() (issue 23), on the real database: PostgreSQL, and SQLite for the
core (tests marked `postgres` need row locks, LISTEN or real worker processes)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from itertools import pairwise

import pytest
from django.db import connection
from django.db.models.functions import Now

import durableruns
from durableruns import services, store
from durableruns.errors import RunCancelled, RunFailed, RunNotFound
from durableruns.limits import PARKED
from durableruns.models import RunState, RunStatus, RunStep
from tests.conftest import CITUS_LANE

pytestmark = pytest.mark.django_db(transaction=True)

# A record distributed by Citus parks no run: its claim walks past a limited run whose key is full (store.spread).
PARKS = connection.vendor == "postgresql" and not CITUS_LANE


@pytest.fixture(autouse=True)
def quick_steps(monkeypatch):
    monkeypatch.setenv("TEST_LIMITED_SECONDS", "0.01")  # in this process; the worker processes get their own


# -- result() -------------------------------------------------------------------------------------------------


def test_result_of_a_completed_run_is_its_results_by_step():
    run_id = durableruns.start("keyed", {"buyer": "b1"})
    services.resume_due()
    results = durableruns.result(run_id, timeout=5)
    assert {step: r["did"] for step, r in results.items()} == {"keyed_open": "open", "keyed_close": "close"}
    assert results == {row.step: row.result for row in RunStep.objects.filter(run_id=run_id)}


def test_result_of_a_failed_run_raises_run_failed_with_its_reason():
    run_id = durableruns.start("refused", {})
    services.resume_due()
    with pytest.raises(RunFailed) as raised:
        durableruns.result(run_id, timeout=5)
    assert raised.value.run_id == run_id and "no such supplier" in raised.value.reason


def test_result_of_a_cancelled_run_raises_run_cancelled_with_its_reason():
    run_id = durableruns.start("limited", {})
    services.cancel_run(run_id, by="ops", note="ordered twice")
    with pytest.raises(RunCancelled) as raised:
        durableruns.result(run_id, timeout=5)
    assert raised.value.run_id == run_id and "ordered twice" in raised.value.reason


def test_result_of_an_unknown_run_raises_run_not_found():
    with pytest.raises(RunNotFound):
        durableruns.result("nobody-ever-started-this", timeout=1)


def test_result_gives_up_after_its_timeout():
    run_id = durableruns.start("limited", {})  # no worker takes it
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        durableruns.result(run_id, timeout=0.3)
    assert 0.3 <= time.monotonic() - began < 1.5


@pytest.mark.postgres
@pytest.mark.skipif(CITUS_LANE, reason="a Citus-distributed record has no run_state_ended trigger: result() polls")
def test_result_is_woken_by_the_end_itself_not_by_a_poll():
    """The run completes 0.4 s after the caller starts waiting: result() returns as that commit lands, long before
    it would read the record again by itself (RECHECK_SECONDS)."""
    from durableruns import results

    assert results.RECHECK_SECONDS >= 5
    run_id = durableruns.start("keyed", {"buyer": "b1"})
    ended: list[float] = []

    def work_it_later() -> None:
        time.sleep(0.4)
        services.resume_due()
        ended.append(time.monotonic())
        connection.close()

    worker = threading.Thread(target=work_it_later)
    began = time.monotonic()
    worker.start()
    assert set(durableruns.result(run_id, timeout=10)) == {"keyed_open", "keyed_close"}
    returned = time.monotonic()
    worker.join()
    assert returned - began >= 0.4
    assert returned - ended[0] < 0.15, f"returned {returned - ended[0]:.3f} s after the run ended"


# -- limits in the claim, on either database --------------------------------------------------------------------


def claim(n: int):
    return store.claim(owner=f"t{n}", lease_seconds=30)


def test_the_claim_takes_no_more_than_the_limit_and_takes_others_past_the_held_back_runs():
    held = [durableruns.start("limited", {"n": n}) for n in range(5)]
    other = durableruns.start("keyed", {"buyer": "b9"})  # started last: the oldest runs are the limited ones
    taken = [claim(n) for n in range(3)]
    assert [t.lease.run_id for t in taken] == held[:3]
    fourth = claim(3)
    assert fourth is not None and fourth.lease.run_id == other  # past the two held back
    assert claim(4) is None
    assert RunState.objects.filter(workflow="limited", status=RunStatus.RUNNING).count() == 3
    if PARKS:  # parked: out of every probe, holding nothing
        assert set(RunState.objects.filter(reason=PARKED, status=RunStatus.WAITING).values_list("pk", flat=True)) \
            == set(held[3:])
    # One ends: its slot frees, and the first held-back run is taken next.
    store.release(taken[0].lease, status=RunStatus.COMPLETED)
    fifth = claim(5)
    assert fifth is not None and fifth.lease.run_id == held[3]
    assert claim(6) is None
    # A worker that died keeps its slot until its run is taken over (the run itself, not another).
    RunState.objects.filter(pk=held[1]).update(lease_expires_at=Now() - timedelta(seconds=1))
    over = claim(7)
    assert over is not None and over.lease.run_id == held[1]
    assert claim(8) is None


def test_a_key_limit_holds_one_run_per_key_at_once():
    a1, a2 = durableruns.start("keyed", {"buyer": "a"}), durableruns.start("keyed", {"buyer": "a"})
    b1 = durableruns.start("keyed", {"buyer": "b"})
    assert RunState.objects.get(pk=a1).concurrency_key == "a"
    assert [claim(0).lease.run_id, claim(1).lease.run_id] == [a1, b1]
    assert claim(2) is None
    assert RunState.objects.get(pk=a2).status != RunStatus.RUNNING


@pytest.mark.postgres
def test_a_run_named_to_a_claim_waits_for_a_claim_of_its_key_in_flight_and_is_refused_after_it():
    """resume_runs --run-id takes a limited run as every claim does, under its key's lock: while another claim of
    the key holds the last slot uncommitted, the named claim waits for it, then counts it and takes nothing."""
    from durableruns.registry import first_steps

    a1, a2 = durableruns.start("keyed", {"buyer": "a"}), durableruns.start("keyed", {"buyer": "a"})
    in_flight, go_on = threading.Event(), threading.Event()
    taken: dict[str, object] = {}

    def hold(_step: str) -> None:  # the first claim's transaction stays open here: a1 admitted, not committed
        in_flight.set()
        go_on.wait(10)

    def first() -> None:
        try:
            taken["first"] = store.claim(owner="first", lease_seconds=30, first_steps=first_steps(),
                                         before_first_intent=hold)
        finally:
            connection.close()

    def named() -> None:
        try:
            taken["named"] = store.claim(owner="named", lease_seconds=30, run_id=a2)
        finally:
            connection.close()

    claims = [threading.Thread(target=first)]
    claims[0].start()
    assert in_flight.wait(10)
    claims.append(threading.Thread(target=named))
    claims[1].start()
    claims[1].join(0.5)
    assert claims[1].is_alive()  # waiting for the key's lock, not counting without it
    go_on.set()
    for thread in claims:
        thread.join(10)
    assert taken["first"].lease.run_id == a1 and taken["named"] is None
    assert RunState.objects.get(pk=a2).status != RunStatus.RUNNING
    assert RunState.objects.filter(workflow="keyed", status=RunStatus.RUNNING).count() == 1


@pytest.mark.postgres
def test_a_limit_raised_by_a_deploy_fills_up_as_runs_are_let_go(monkeypatch):
    from durableruns import registry

    runs = [durableruns.start("limited", {"n": n}) for n in range(7)]
    taken = [claim(n) for n in range(3)]
    assert claim(3) is None
    assert RunState.objects.filter(pk__in=runs).exclude(status=RunStatus.RUNNING).count() == 4
    if PARKS:
        assert RunState.objects.filter(reason=PARKED).count() == 4
    monkeypatch.setattr(registry.get_workflow("limited"), "concurrency", 5)  # the next deploy's limit
    monkeypatch.setattr(registry, "_limits", (-1, {}))
    store.release(taken[0].lease, status=RunStatus.COMPLETED)  # lets one go; each admitted with room lets another
    assert [claim(n).lease.run_id for n in range(4, 7)] == runs[3:6]
    assert claim(7) is None
    assert RunState.objects.filter(pk__in=runs, status=RunStatus.RUNNING).count() == 5


# -- limits across worker processes (PostgreSQL) -------------------------------------------------------------


@pytest.mark.postgres
def test_limits_hold_across_two_worker_processes(workers):
    """50 runs of concurrency=3 and 3 buyers x 6 runs of a key limit 1, across two workers of 8 threads each:
    never more than 3 live leases of the limited workflow (sampled from the record while they run, and from the
    steps' own times after), the runs of one buyer never overlap, and every run completes."""
    limited = [durableruns.start("limited", {"n": n}) for n in range(50)]
    keyed = {buyer: [durableruns.start("keyed", {"buyer": buyer}) for _ in range(6)] for buyer in "xyz"}
    everything = limited + [r for runs in keyed.values() for r in runs]
    for name in ("w1", "w2"):
        workers.start("--loop", "--concurrency", "8", "--interval", "0.5", "--worker", name, TEST_LIMITED_SECONDS="0.1")
    live = RunState.objects.filter(workflow="limited", status=RunStatus.RUNNING, lease_expires_at__gt=Now())
    most, samples = 0, 0
    deadline = time.monotonic() + 60
    while RunState.objects.filter(pk__in=everything, status=RunStatus.COMPLETED).count() < len(everything):
        assert time.monotonic() < deadline, "the runs did not all complete within 60 s"
        most, samples = max(most, live.count()), samples + 1
        time.sleep(0.01)
    # (the workers fixture kills both: every run has ended)
    assert samples > 20 and most == 3, (samples, most)  # the limit was reached, and never passed

    # The steps' own times say the same, whatever the sampling missed: at no moment more than 3 steps at work.
    # (Each step records when its work began and ended, on this host's clock, which the workers share. run_step's
    # started_at is the claim transaction's now(), its start: a claim that waited for a slot's lock began before
    # the run it waited for had ended, so those times would show overlaps that never were.)
    spans = [_span(run_id) for run_id in limited]
    moments = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    in_hand = [0]
    for _, change in moments:  # an end sorts before a start at the same instant
        in_hand.append(in_hand[-1] + change)
    assert max(in_hand) == 3

    for buyer, runs in keyed.items():
        spans = sorted(_span(run_id) for run_id in runs)  # each run: its first step's start to its last's end
        for (_, end), (start, _) in pairwise(spans):
            assert start >= end, f"runs of buyer {buyer} overlapped"


def _span(run_id: str) -> tuple[float, float]:
    times = [row["began"] for row in _results(run_id)] + [row["ended"] for row in _results(run_id)]
    return min(times), max(times)


def _results(run_id: str) -> list[dict[str, float]]:
    return list(RunStep.objects.filter(run_id=run_id, status="completed").values_list("result", flat=True))
