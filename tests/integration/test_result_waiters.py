"""A run's end notifies durableruns_ended only when someone waits for it (issue 34, migration 0028): a NOTIFY
serializes every notifying commit in PostgreSQL, so the runs nobody waits for end without one. A waiter records
itself (store.await_end) after its LISTEN and before its first read, and is gone once result() returns."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connection

import durableruns
from durableruns import services, store
from durableruns.connections import plain_params
from durableruns.models import RunWaiter
from durableruns.results import ENDED_CHANNEL

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def listening() -> psycopg.Connection:
    conn = psycopg.connect(**plain_params("default"), autocommit=True)
    conn.execute(f"LISTEN {ENDED_CHANNEL}")
    return conn


def heard(conn: psycopg.Connection, seconds: float = 0.5) -> list[str]:
    return [note.payload for note in conn.notifies(timeout=seconds)]


def test_a_run_nobody_waits_for_ends_without_a_notification_and_one_awaited_with_one():
    with listening() as ear:
        unwatched = durableruns.start("keyed", {"buyer": "b1"})
        services.resume_due()
        assert durableruns.boundary(unwatched).status == "completed"
        assert heard(ear) == []

        watched = durableruns.start("keyed", {"buyer": "b2"})
        with listening() as caller:
            waiter = store.await_end(caller, watched)
            assert list(RunWaiter.objects.values_list("run_id", flat=True)) == [watched]
            services.resume_due()
            assert heard(caller) == [watched]
            store.forget_waiter(caller, waiter)
        assert heard(ear) == [watched]  # every listener hears it: the payload says which run
    assert not RunWaiter.objects.exists()


def test_result_leaves_no_waiter_behind_whether_it_returns_or_times_out():
    run_id = durableruns.start("keyed", {"buyer": "b3"})
    with pytest.raises(TimeoutError):
        durableruns.result(run_id, timeout=0.2)
    assert not RunWaiter.objects.exists()

    def work_it_later() -> None:
        time.sleep(0.3)
        services.resume_due()
        connection.close()

    worker = threading.Thread(target=work_it_later)
    worker.start()
    assert set(durableruns.result(run_id, timeout=10)) == {"keyed_open", "keyed_close"}
    worker.join()
    assert not RunWaiter.objects.exists()


def test_a_waiter_recorded_while_the_end_is_in_flight_still_sees_the_end():
    """The end's commit is held open (its row locked) while a caller records itself: the caller's FOR SHARE waits
    for it, so the caller's first read, after that, finds the run ended; nothing falls between the two."""
    run_id = durableruns.start("keyed", {"buyer": "b4"})
    with psycopg.connect(**plain_params("default")) as ending:
        ending.execute("UPDATE run_state SET status = 'completed' WHERE run_id = %s", (run_id,))
        recorded: list[int] = []

        def record() -> None:
            with listening() as caller:
                recorded.append(store.await_end(caller, run_id))
                store.forget_waiter(caller, recorded[0])

        waiting = threading.Thread(target=record)
        waiting.start()
        waiting.join(timeout=0.5)
        assert waiting.is_alive(), "the waiter did not wait for the end in flight"
        ending.commit()
        waiting.join(timeout=10)
    assert recorded and durableruns.boundary(run_id).status == "completed"
