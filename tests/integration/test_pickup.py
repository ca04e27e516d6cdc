"""Pick-up in milliseconds on PostgreSQL: idle workers are woken by what makes a run due, not by their next poll.

Each worker here polls only every 30 s, so a run worked within the tests' waits was picked up by a notification
or by the timer for the next wake time, never by polling.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models.functions import Now

import durableruns
from durableruns import services, store
from durableruns.models import Escalation, RunState, RunStatus, WorkerPresence
from durableruns.worker.listener import Listener
from durableruns.worker.pool import Stopping, Waker
from tests.conftest import wait_until
from tests.factories import complete, crash_after_intent, make_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

SLOW_POLL = ("--loop", "--interval", "30", "--concurrency", "2")


def status(run_id: str) -> str:
    return RunState.objects.get(pk=run_id).status


def admin_connection() -> psycopg.Connection:
    db = settings.DATABASES["default"]
    return psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"] or "postgres",
                           dbname=connection.settings_dict["NAME"], autocommit=True)


def started(worker) -> None:
    wait_until(lambda: any(row for row in admin_connection().execute(
        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN durableruns_due'")),
        what="the worker to listen")


def test_a_new_run_and_a_decision_are_picked_up_by_an_idle_worker_at_once(workers):
    decided = make_run()
    complete(decided, "first", {})
    complete(decided, "second", {})
    crash_after_intent(decided, "third", cursor=2)  # the worker's first look escalates it
    worker = workers.start(*SLOW_POLL)
    started(worker)
    wait_until(lambda: Escalation.objects.filter(run_id=decided).exists(), timeout=10, what="the escalation")
    run_id = durableruns.start("scripted", {})
    wait_until(lambda: status(run_id) == RunStatus.COMPLETED, timeout=10, what="the new run to be worked")
    durableruns.decide(decided, "third", "happened", by="alice", note="it is in the outbox", result={"ok": 1})
    wait_until(lambda: status(decided) == RunStatus.COMPLETED, timeout=10, what="the decided run to finish")
    worker.terminate()
    out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert "listening on durableruns_due" in out  # the first line and the summary say how work is picked up


def test_a_wake_time_coming_due_wakes_the_idle_worker(far, workers):
    run_id = make_run("order")
    complete(run_id, "prepare", {"total": 10, "lines": 60})
    crash_after_intent(run_id, "charge", cursor=1)
    # Not found at the payment provider, and absence provable only 6.2 s after the attempt: the run waits, and
    # the worker's timer for that wake time, not its 30 s poll, brings it back.
    worker = workers.start(*SLOW_POLL, TEST_LOOKUP_LAG="6", TEST_STEP_TIMEOUT="0.2")
    wait_until(lambda: status(run_id) == RunStatus.WAITING, timeout=6, every=0.02, what="the run to wait out the lag")
    wait_until(lambda: status(run_id) == RunStatus.COMPLETED, timeout=15, what="the wake time to be met")
    assert far.payments.count() == 1
    worker.terminate()
    worker.communicate(timeout=30)


def test_a_run_started_in_a_transaction_that_rolls_back_wakes_nobody():
    waker = Waker()
    listener = Listener(waker).start()
    try:
        assert listener.listening.wait(5)
        with pytest.raises(RuntimeError), transaction.atomic():
            durableruns.start("scripted", {})
            raise RuntimeError("the caller's own write failed")
        time.sleep(0.5)
        assert listener.notifications == 0 and not RunState.objects.exists()
        with transaction.atomic():
            durableruns.start("scripted", {})
        wait_until(lambda: listener.notifications == 1, timeout=5, what="the committed run's notification")
    finally:
        listener.stop()


def presence(name: str) -> WorkerPresence | None:
    return WorkerPresence.objects.filter(pk=name).first()


def test_a_lost_listener_falls_back_to_polling_says_so_once_and_listens_again(workers):
    # The worker reports how it picks work up every half second here (a health check reads run_worker).
    worker = workers.start("--loop", "--interval", "0.3", "--concurrency", "1", "--worker", "picker",
                           DURABLERUNS_STUCK_MARGIN_SECONDS="1")
    started(worker)
    wait_until(lambda: (p := presence("picker")) is not None and p.listening, what="its presence, listening")
    with admin_connection() as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                      "AND query = 'LISTEN durableruns_due'")
    run_id = durableruns.start("scripted", {})  # while nobody listens: polling picks it up
    wait_until(lambda: status(run_id) == RunStatus.COMPLETED, timeout=10, what="the run to be polled up")

    # Keep the listener from coming back for a while: the health check's field says the worker polls.
    def polling_reported() -> bool:
        with admin_connection() as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
                          " AND query = 'LISTEN durableruns_due'")
        return presence("picker").pickup.startswith("polling (listener lost")

    wait_until(polling_reported, every=0.1, what="its presence to say it polls")
    started(worker)  # listening again
    wait_until(lambda: presence("picker").listening, what="its presence to say it listens again")
    worker.terminate()
    out, err = worker.communicate(timeout=30)
    row = presence("picker")
    assert row.stopped_at is not None and row.threads == 1 and abs(row.skew_seconds) < 5
    # Each loss said once, each recovery once: not a line per retry.
    lost, back = err.count("listener lost"), err.count("listening on durableruns_due again")
    assert lost >= 1 and lost == back, err


@contextmanager
def idle_pool(threads: int, owner: str) -> Iterator[tuple[list[str], Waker]]:
    """A listening --loop pass of `threads` threads, in a thread of its own, once each has looked and gone idle;
    yields the list of the claims made from then on (the claiming thread's name for each) and the pass's waker,
    and stops the pass."""
    claims: list[str] = []
    waker, stopping = Waker(), Stopping()
    started_line: list[str] = []

    def work() -> None:
        try:
            services.resume_due(concurrency=threads, owner=owner, waker=waker, stopping=stopping, listen=True,
                                idle_seconds=30, on_start=started_line.append,
                                on_claim=lambda seconds: claims.append(threading.current_thread().name))
        finally:
            connections.close_all()

    pass_ = threading.Thread(target=work)
    pass_.start()
    try:
        wait_until(lambda: started_line and waker.idle == threads, what=f"{threads} threads to look and go idle")
        claims.clear()
        yield claims, waker
    finally:
        stopping.set()
        pass_.join(30)


def test_a_new_run_rouses_one_idle_thread_not_all_of_them_and_a_burst_fans_out():
    """Eight idle threads, listening: one new run costs a claim or two, not a claim per idle thread; a burst of
    runs still reaches every thread."""
    with idle_pool(8, "rouse") as (claims, waker):
        run_id = durableruns.start("scripted", {})
        wait_until(lambda: status(run_id) == RunStatus.COMPLETED and waker.idle == 8, timeout=10,
                   what="the new run, and every thread idle again")
        assert len(claims) <= 2, claims
        with transaction.atomic():  # one commit, one notification for the eight runs
            burst = [make_run("pool_napping", {"nap": 0.5}) for _ in range(8)]
        wait_until(lambda: RunState.objects.filter(pk__in=burst, status=RunStatus.COMPLETED).count() == 8,
                   timeout=10, what="the burst")
        owners = set(RunState.objects.filter(pk__in=burst).values_list("owner", flat=True))
        assert len(owners) >= 6, owners  # worked side by side, not one after another


def test_runs_started_one_after_another_while_threads_work_cost_about_one_claim_each():
    """Runs started one at a time while the threads are busy with earlier ones: each start's notification sends
    one thread to claim. A thread that ends a run while a claim answering the last notification is under way goes
    idle instead of claiming beside it, and a claim that saw another run due behind its own wakes no second thread
    for it when that run's notification has come already: either would be a claim that finds nothing."""
    runs = []
    with idle_pool(8, "trickle-busy") as (claims, waker):
        for _ in range(RUNS_ONE_BY_ONE):
            runs.append(durableruns.start("pool_napping", {"nap": 0.02}))
            time.sleep(0.005)
        wait_until(lambda: RunState.objects.filter(pk__in=runs, status=RunStatus.COMPLETED).count() == len(runs)
                   and waker.idle == 8, timeout=30, what="every run, and every thread idle again")
    assert len(claims) <= 1.15 * len(runs), f"{len(claims)} claims for {len(runs)} runs"


RUNS_ONE_BY_ONE = 60


def test_a_thread_that_ends_a_run_while_nothing_else_is_due_goes_idle_without_a_claim():
    """Runs started one at a time, each ending before the next starts: each costs the one claim that takes it.
    The thread that ended it knows, from the process's own last claims and the notifications since, that nothing
    else is due, so it goes idle at once instead of claiming to find nothing; and it still takes what comes."""
    with idle_pool(4, "trickle") as (claims, waker):
        runs = [durableruns.start("scripted", {})]
        for _ in range(5):
            wait_until(lambda: status(runs[-1]) == RunStatus.COMPLETED and waker.idle == 4, timeout=10,
                       what="the run, and its thread idle again")
            runs.append(durableruns.start("scripted", {}))
        wait_until(lambda: status(runs[-1]) == RunStatus.COMPLETED and waker.idle == 4, timeout=10,
                   what="the last run, and its thread idle again")
        assert len(claims) == len(runs), claims  # one claim a run: none found nothing
        # A run that comes due by itself is still met by a thread's timer, not left to the 30 s poll.
        timed = durableruns.start("scripted", {})
        wait_until(lambda: status(timed) == RunStatus.COMPLETED, timeout=10, what="the run before the timed one")
        with transaction.atomic():  # set to wait as store.release does it, which notifies
            RunState.objects.filter(pk=timed).update(status=RunStatus.WAITING, wake_at=Now() + timedelta(seconds=1))
            store.wake_workers()
        wait_until(lambda: status(timed) == RunStatus.COMPLETED, timeout=5, what="the run whose wake time came")


def test_the_timer_of_a_thread_whose_claim_found_nothing_is_what_that_claim_read():
    """An idle thread's timer (when the next run comes due by itself) rides on the claim that found nothing: no
    statement of its own then, the same figure, on the database's clock; asked again later, it reads anew."""
    from django.db.models.functions import Now
    from django.test.utils import CaptureQueriesContext

    from durableruns import store
    from durableruns.worker.listener import seconds_until_next_due

    run_id = make_run()
    RunState.objects.filter(pk=run_id).update(status=RunStatus.WAITING, wake_at=Now() + timedelta(seconds=60))
    assert store.claim(owner="timer", lease_seconds=30, hints=True) is None
    with CaptureQueriesContext(connection) as queries:
        seconds = seconds_until_next_due()
    assert len(queries) == 0 and seconds is not None and 58 < seconds <= 60
    with CaptureQueriesContext(connection) as queries:
        again = seconds_until_next_due()
    assert len(queries) == 1 and again is not None and 58 < again <= 60
    RunState.objects.filter(pk=run_id).update(status=RunStatus.PENDING, wake_at=None)
    assert store.claim(owner="timer", lease_seconds=30, hints=True) is not None
    with CaptureQueriesContext(connection) as queries:
        assert seconds_until_next_due() is not None  # the claim took a run: the timer reads for itself
    assert len(queries) == 1


def test_a_claim_says_whether_another_run_was_due_behind_the_one_it_took():
    """The thread that took a run wakes another idle one only if another was due: a lone new run costs one claim."""
    from django.db.models.functions import Now

    from durableruns import store
    from durableruns.store import more_due_after_last_claim

    first, second, later = make_run(), make_run(), make_run()
    RunState.objects.filter(pk=later).update(status=RunStatus.WAITING, wake_at=Now() + timedelta(seconds=60))
    taken = store.claim(owner="more", lease_seconds=30, hints=True)
    assert taken is not None and taken.lease.run_id == first and more_due_after_last_claim() is True
    taken = store.claim(owner="more", lease_seconds=30, hints=True)
    assert taken is not None and taken.lease.run_id == second
    assert more_due_after_last_claim() is False  # the waiting run behind it is not due yet
    assert store.claim(owner="more", lease_seconds=30, hints=True) is None
    assert more_due_after_last_claim() is True  # nothing known: the caller wakes, as it always did
    # A pass with no idle threads to wake (--once) does not ask: the claim reads neither hint.
    make_run(), make_run()
    assert store.claim(owner="once", lease_seconds=30) is not None
    assert more_due_after_last_claim() is True  # not known, though another was due behind it
