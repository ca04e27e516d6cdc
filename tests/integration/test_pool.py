"""Many runs in flight in one worker process: threads that claim as separate workers do, one heartbeat for all
their leases, a pass that drains what is due, and a stop that hands runs back between steps."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from durableruns import services, store
from durableruns.models import RunState, RunStatus, RunStep
from durableruns.store import Lease
from durableruns.worker.heartbeat import Heartbeat
from tests.conftest import CITUS_LANE, wait_until
from tests.factories import make_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

def owners(run_ids: list[str]) -> set[str]:
    return set(RunState.objects.filter(pk__in=run_ids).values_list("owner", flat=True))


@override_settings(DURABLERUNS_PREFETCH=1)  # one run a claim: each claim counted below; several: test_prefetch.py
def test_eight_threads_work_eight_runs_at_once_each_step_once():
    run_ids = [make_run("pool_napping", {"nap": 0.4}) for _ in range(16)]
    report = services.resume_due(concurrency=8, owner="host:1")
    assert report.counts() == {"completed": 16} and report.steps_run == 32
    # A claim for each run, and one a thread that found nothing: a --once pass's thread stops at its first.
    assert (report.claims, report.found_nothing) == (24, 8), report.summary()
    assert "24 claim(s), 8 found nothing" in report.summary()
    assert owners(run_ids) <= {f"host:1#{n}" for n in range(1, 9)} and len(owners(run_ids)) == 8
    assert RunStep.objects.filter(run_id__in=run_ids).count() == 32  # one attempt per step per run
    assert set(RunStep.objects.values_list("attempt", flat=True)) == {1}


@pytest.mark.skipif(CITUS_LANE, reason="on a Citus cluster each lease is renewed on its run's shard, one by one")
def test_one_heartbeat_statement_renews_every_lease_in_hand():
    for _ in range(5):
        make_run("pool_napping")
    leases = [store.claim(owner="w", lease_seconds=30).lease for _ in range(5)]
    before = dict(RunState.objects.values_list("run_id", "lease_expires_at"))
    taken = make_run("pool_napping")
    theirs = store.claim(owner="thief", lease_seconds=30).lease  # a sixth run, someone else's
    stale = Lease(run_id=taken, owner="w", epoch=theirs.epoch - 1, seconds=30)
    heartbeat = Heartbeat()
    with CaptureQueriesContext(connection) as captured:
        heartbeat.beat([*leases, stale])
    assert len(captured.captured_queries) == 1  # one statement for six leases
    after = dict(RunState.objects.values_list("run_id", "lease_expires_at"))
    assert all(after[lease.run_id] > before[lease.run_id] for lease in leases)
    assert heartbeat.renewed == 5 and heartbeat.beats == 1  # the stale epoch was not renewed


def test_a_start_deferred_on_the_heartbeat_comes_once_at_its_time_and_never_after_the_heartbeat_stops():
    started: list[float] = []
    with Heartbeat() as heartbeat:
        heartbeat.hold(Lease(run_id="held", owner="w", epoch=1, seconds=30))  # its first beat 10 s away
        began = time.monotonic()
        heartbeat.after(0.3, lambda: started.append(time.monotonic()))
        time.sleep(0.1)
        assert started == []
        wait_until(lambda: started, what="the deferred start", timeout=5)
    assert started[0] - began >= 0.29
    with Heartbeat() as heartbeat:
        heartbeat.after(0.3, lambda: started.append(time.monotonic()))
    time.sleep(0.5)
    assert len(started) == 1  # stopped first: never started


def test_a_short_pass_starts_no_watchdog_and_a_long_one_has_it_look(monkeypatch, settings):
    settings.DURABLERUNS_STUCK_MARGIN_SECONDS = 0.5  # the watchdog looks every 0.5 s
    threads: list[set[str]] = []
    short = services.resume_due(on_outcome=lambda _: threads.append({t.name for t in threading.enumerate()}),
                                run_id=make_run("scripted"))
    assert short.counts() == {"completed": 1}
    assert "durableruns-heartbeat" in threads[0] and "durableruns-watchdog" not in threads[0]
    monkeypatch.setenv("TEST_STUCK_SECONDS", "1.6")  # past its 0.2 s timeout and the margin from 0.7 s on
    stuck = make_run("stuck_probe")
    long = services.resume_due(on_outcome=lambda _: threads.append({t.name for t in threading.enumerate()}),
                               run_id=stuck)
    assert "durableruns-watchdog" in threads[1]
    assert len(long.outlived) == 1 and f"run {stuck}: blocks" in long.outlived[0], long.outlived


def test_once_drains_everything_due_with_no_cap_by_default(workers):
    run_ids = [make_run("pool_napping", {"nap": 0}) for _ in range(130)]
    done = workers.run("--once", "--concurrency", "4", timeout=120)
    assert done.returncode == 0, done.stderr
    assert RunState.objects.filter(pk__in=run_ids, status=RunStatus.COMPLETED).count() == 130
    assert "130 run(s) handled" in done.stdout
    capped = [make_run("pool_napping", {"nap": 0}) for _ in range(5)]
    assert workers.run("--once", "--limit", "2").returncode == 0
    assert RunState.objects.filter(pk__in=capped, status=RunStatus.COMPLETED).count() == 2


def test_sigterm_lets_the_steps_in_hand_finish_and_hands_the_runs_back_between_steps(workers):
    run_ids = [make_run("pool_napping", {"nap": 1.5}) for _ in range(3)]
    worker = workers.start("--loop", "--concurrency", "2", "--interval", "0.1", "--worker", "deploying")
    wait_until(lambda: RunStep.objects.filter(step="nap", status="started").count() == 2,
               what="two runs in their first step")
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    steps = list(RunStep.objects.filter(run_id__in=run_ids).values_list("run_id", "step", "status"))
    # The two steps in hand completed; nothing was started after the signal, nothing is left in doubt.
    assert sorted(status for _, _, status in steps) == ["completed", "completed"], steps
    handed_back = RunState.objects.filter(pk__in=run_ids, status=RunStatus.PENDING, cursor=1)
    assert handed_back.count() == 2 and all("stopping" in r.reason for r in handed_back)
    assert RunState.objects.filter(pk__in=run_ids, status=RunStatus.PENDING, cursor=0).count() == 1  # never taken
    finish = workers.run("--once")
    assert finish.returncode == 0 and RunState.objects.filter(status=RunStatus.COMPLETED).count() == 3


def test_a_second_signal_exits_at_once_and_the_record_stays_safe(workers):
    run_id = make_run("pool_napping", {"nap": 20})
    worker = workers.start("--loop", "--concurrency", "1", "--interval", "0.1")
    wait_until(lambda: RunStep.objects.filter(run_id=run_id, status="started").exists(), what="the step to start")
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    worker.send_signal(signal.SIGTERM)
    worker.communicate(timeout=10)  # the step sleeps 20 s: only an immediate exit ends within this
    assert worker.returncode == 128 + signal.SIGTERM
    assert list(RunStep.objects.filter(run_id=run_id).values_list("status", flat=True)) == ["started"]  # in doubt


def test_a_step_that_outlives_its_timeout_is_named_while_the_other_threads_go_on(workers, client,
                                                                                 django_user_model, settings):
    stuck = make_run("stuck_probe")
    worker = workers.start("--loop", "--concurrency", "2", "--interval", "0.1", "--worker", "w",
                           DURABLERUNS_STUCK_MARGIN_SECONDS="0.5", TEST_STUCK_SECONDS="10")
    wait_until(lambda: RunStep.objects.filter(run_id=stuck, status="started").exists(), what="the blocking step")
    others = [make_run("scripted") for _ in range(4)]
    wait_until(lambda: RunState.objects.filter(pk__in=others, status=RunStatus.COMPLETED).count() == 4,
               what="the other thread to work the other runs")
    # The admin's runs list says so too, on the database's record alone.
    settings.DURABLERUNS_STUCK_MARGIN_SECONDS = 0.5
    staff = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw")
    client.force_login(staff)
    wait_until(lambda: "blocks has been in hand for" in client.get("/admin/durableruns/runstate/").content.decode(),
               what="the admin to name the blocked step")
    page = client.get("/admin/durableruns/runstate/").content.decode()
    assert "past its 0.2s timeout" in page and "on w#" in page
    worker.terminate()
    out, err = worker.communicate(timeout=30)
    assert f"run {stuck}: blocks (attempt 1) in hand on w#" in err and "past its 0.2s timeout" in err, err
    assert err.count(f"run {stuck}: blocks") == 1  # said once, not at every look
    assert "outlived its timeout: run" in out  # and in the summary
