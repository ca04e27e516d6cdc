"""What issue 34 changed in the record's writes, on PostgreSQL.

A run's end notifies durableruns_ended only when someone waits for it (migration 0029): a NOTIFY serializes every
notifying commit in PostgreSQL, so the runs nobody waits for end without one. A waiter records itself
(store.await_end) after its LISTEN and before its first read, and is gone once result() returns. And a step's
statement updates the run's row in place (HOT), the lease being the heartbeat's."""

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
from tests.conftest import CITUS_LANE

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.skipif(
        CITUS_LANE,
        reason="the single-node path's commits, run_waiter and in-place updates; a cluster drops the end trigger and"
        " result() polls",
    ),
]


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



def test_a_steps_result_and_next_intent_update_the_runs_row_in_place():
    """A step's statement moves the cursor and leaves the lease to the heartbeat: it changes no column any index of
    run_state names (lease_expires_at is in an index predicate), so PostgreSQL updates the row in place (HOT), with
    no new index entry. The engine's own statement, sent in a transaction of the test's so that the backend's
    counters (pg_stat_get_xact_*, exact; they may still hold the claim's, not yet reported) are read just before
    and just after it."""
    from django.db import transaction

    from durableruns.registry import effect_key, first_steps
    from durableruns.store.attempts import _intent_params, _pg_record_result
    from durableruns.store.base import lease_times

    run_id = durableruns.start("keyed", {"buyer": "b5"})
    claimed = store.claim(owner="w", lease_seconds=30, first_steps=first_steps())
    assert claimed is not None and claimed.first_intent is not None
    lease = claimed.lease
    nxt = store.Intent(step="keyed_close", attempt=1, effect_key=effect_key(run_id, "keyed_close"), cursor=1)
    counters = ("SELECT pg_stat_get_xact_tuples_updated('run_state'::regclass), "
                "pg_stat_get_xact_tuples_hot_updated('run_state'::regclass)")
    with transaction.atomic():
        with connection.cursor() as cursor:  # what this backend counted and has not reported yet
            cursor.execute(counters)
            updated_before, in_place_before = cursor.fetchone()
        recorded = _pg_record_result(run=run_id, epoch=lease.epoch, owner=lease.owner,
                                     times=lease_times(lease, store.DATABASE), cursor=1, step="keyed_open", attempt=1,
                                     result='{"did": "open"}', resolution="returned", finish=False,
                                     intent=_intent_params(nxt))
        with connection.cursor() as cursor:
            cursor.execute(counters)
            updated, in_place = cursor.fetchone()
    assert recorded is True
    assert (updated - updated_before, in_place - in_place_before) == (1, 1)
