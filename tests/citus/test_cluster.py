"""The record on a Citus cluster (the Citus lane, tests/citus/lane.py): its layout, and the hot path committed
on one node at a time (no two-phase commit), read from Citus's own record of distributed transactions."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

import durableruns
from durableruns.models import RunState, RunStep
from durableruns.store.sql import WAKE_CHANNEL
from tests.conftest import Workers, database_url, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def query(sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def two_phase_commits() -> int:
    """The two-phase commits the coordinator has made (the cluster keeps their records: tests/citus/cluster.py)."""
    return int(query("SELECT count(*) FROM pg_dist_transaction")[0][0])


def test_the_run_tables_are_colocated_by_run_id_and_the_plans_are_a_reference_table() -> None:
    rows = query(
        "SELECT logicalrelid::regclass::text, partmethod, colocationid, "
        "column_to_column_name(logicalrelid, partkey) FROM pg_dist_partition "
        "WHERE logicalrelid::regclass::text LIKE 'run%%'"
    )
    layout = {name: (method, group, column) for name, method, group, column in rows}
    groups = {layout[t][1] for t in ("run_state", "run_step", "run_event", "run_attribute")}
    assert len(groups) == 1, layout
    for table in ("run_state", "run_step", "run_event", "run_attribute"):
        assert layout[table][0] == "h" and layout[table][2] == "run_id", layout
    for table in ("run_plan", "run_escalation", "run_intervention"):
        assert layout[table][0] == "n", layout
    for table in ("run_count", "run_worker", "run_schedule", "run_rate_turn"):
        assert table not in layout, layout
    # the shards are on the two workers, none on the coordinator
    placements = query(
        "SELECT DISTINCT nodeport FROM pg_dist_shard_placement JOIN pg_dist_shard USING (shardid) "
        "WHERE logicalrelid = 'run_state'::regclass"
    )
    assert len(placements) == 2


def test_distribute_runs_twice_says_there_is_nothing_to_do() -> None:
    out = io.StringIO()
    call_command("distribute_runs", stdout=out)
    assert "nothing to do" in out.getvalue()


def test_starts_claims_intents_results_waits_and_events_make_no_two_phase_commit(workers: Workers, far: Any) -> None:
    """Runs of the order workflow (four steps) and of the waiting one (an event, a sleep) to their end, by real
    worker processes: every write of the hot path names one run, so each commit is one node's own."""
    durableruns.start("order", {"extra": 0}, run_id="warm")  # the plans' first records: reference tables
    durableruns.start("waiting", {"total": 5, "cool_off": 0.2}, run_id="warm-w")
    before = two_phase_commits()
    orders = [f"po-{i}" for i in range(12)]
    for run_id in orders:
        durableruns.start("order", {"extra": 1}, run_id=run_id)
    waits = [f"wait-{i}" for i in range(4)]
    for run_id in waits:
        durableruns.start("waiting", {"total": 5, "cool_off": 0.2}, run_id=run_id)
    done = workers.run("--once", timeout=120)
    assert done.returncode == 0, done.stderr
    for run_id in waits:  # each waits for its supplier's confirmation now
        assert RunState.objects.get(pk=run_id).status == "waiting"
        durableruns.send(run_id, "supplier_confirmed", {"ref": run_id})
    worker = workers.start("--loop", "--concurrency", "4")
    wait_until(
        lambda: RunState.objects.filter(pk__in=orders + waits, status="completed").count() == 16,
        timeout=60,
        what="every run completed",
    )
    worker.terminate()
    worker.communicate(timeout=30)
    assert RunStep.objects.filter(run_id__in=orders).count() == 48
    assert two_phase_commits() == before, query("SELECT gid FROM pg_dist_transaction ORDER BY gid")


def test_the_runs_land_on_both_workers_and_a_worker_process_finds_them_all(workers: Workers, far: Any) -> None:
    runs = [f"spread-{i}" for i in range(20)]
    for run_id in runs:
        durableruns.start("order", {"extra": 0}, run_id=run_id)
    nodes = query(
        "SELECT p.nodeport, count(*) FROM unnest(%s::text[]) AS r(run_id) "
        "JOIN pg_dist_placement pl "
        "ON pl.shardid = get_shard_id_for_distribution_column('run_state', r.run_id) "
        "JOIN pg_dist_node p ON p.groupid = pl.groupid GROUP BY p.nodeport",
        [runs],
    )
    assert len(nodes) == 2 and all(count > 0 for _, count in nodes), nodes
    done = workers.run("--once", timeout=120)
    assert done.returncode == 0, done.stderr
    assert RunState.objects.filter(pk__in=runs, status="completed").count() == 20


def test_a_start_and_an_event_each_notify_the_coordinators_listeners(workers: Workers, far: Any) -> None:
    """On a distributed record a start takes the ORM's path, not the one-statement insert that notifies: it must
    notify all the same, or an idle worker sleeps through it until its poll. So must an event for a waiting run."""
    import psycopg

    with psycopg.connect(database_url(), autocommit=True) as listener:
        listener.execute(f"LISTEN {WAKE_CHANNEL}")
        durableruns.start("waiting", {"total": 5, "cool_off": 0.1}, run_id="heard")
        assert len(list(listener.notifies(timeout=2, stop_after=1))) == 1, "a start notified nobody"
        done = workers.run("--once", timeout=120)
        assert done.returncode == 0, done.stderr
        assert RunState.objects.get(pk="heard").status == "waiting"
        list(listener.notifies(timeout=0.5))  # the worker's own (a run set to wait notifies)
        durableruns.send("heard", "supplier_confirmed", {"ref": "x"})
        assert len(list(listener.notifies(timeout=2, stop_after=1))) == 1, "an event notified nobody"


def test_debounced_starts_with_one_key_on_every_thread_make_one_run_and_no_two_phase_commit() -> None:
    """Four keys, each started 3 times by each of 6 threads at once (a barrier): the key's lock on the coordinator
    stands in for the unique index a distributed record cannot keep, so each key has exactly one run, every start
    answered with its id; and each start commits on its run's node alone."""
    import threading

    from django.db import connections

    durableruns.start("requote", {"edit": -1}, debounce=timedelta(seconds=30), key="warm")  # the plan's record
    before = two_phase_commits()
    keys = [f"order-{k}" for k in range(4)]
    barrier = threading.Barrier(6)
    answers: dict[str, set[str]] = {key: set() for key in keys}
    errors: list[BaseException] = []

    def start(n: int) -> None:
        try:
            barrier.wait()
            for round in range(3):
                for key in keys:
                    run_id = durableruns.start(
                        "requote", {"edit": n * 10 + round}, debounce=timedelta(seconds=30), key=key
                    )
                    answers[key].add(run_id)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=start, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    runs = dict(RunState.objects.filter(debounce_key__in=keys).values_list("debounce_key", "run_id"))
    assert {key: {runs[key]} for key in keys} == answers
    assert two_phase_commits() == before, query("SELECT gid FROM pg_dist_transaction ORDER BY gid")


def test_limited_runs_on_both_nodes_keep_their_limit_and_their_claims_make_no_two_phase_commit(
    workers: Workers, far: Any
) -> None:
    """Runs of a workflow limited to 3 and of one limited to 1 per buyer, on both worker nodes, drained by two
    --loop worker processes of 6 threads: each claim counts its key's slots across the shards under the key's lock on
    the coordinator, and still commits on the run's node alone. The steps' own times (each records when its work
    began and ended) never show more than 3 at once, nor two runs of one buyer overlapping."""
    durableruns.start("limited", {"n": -1}, run_id="warm-l")  # the plans' first records: reference tables
    durableruns.start("keyed", {"buyer": "warm"}, run_id="warm-k")
    before = two_phase_commits()
    limited = [durableruns.start("limited", {"n": n}) for n in range(18)]
    acme = [durableruns.start("keyed", {"buyer": "acme"}) for _ in range(5)]
    nodes = query(
        "SELECT count(DISTINCT pl.groupid) FROM unnest(%s::text[]) AS r(run_id) "
        "JOIN pg_dist_placement pl ON pl.shardid = get_shard_id_for_distribution_column('run_state', r.run_id)",
        [limited],
    )
    assert nodes[0][0] == 2
    # --loop: a thread that finds every due run's key full waits for work instead of ending its pass
    for name in ("w1", "w2"):
        workers.start("--loop", "--concurrency", "6", "--interval", "0.5", "--worker", name, TEST_LIMITED_SECONDS="0.1")
    wait_until(
        lambda: RunState.objects.filter(pk__in=[*limited, *acme, "warm-l", "warm-k"], status="completed").count() == 25,
        timeout=90,
        what="every run completed",
    )
    workers.stop_all()
    assert two_phase_commits() == before, query("SELECT gid FROM pg_dist_transaction ORDER BY gid")

    def spans(run_ids: list[str]) -> list[tuple[float, float]]:
        results = RunStep.objects.filter(run_id__in=run_ids, status="completed").values_list("run_id", "result")
        by_run: dict[str, list[float]] = {}
        for run_id, result in results:
            by_run.setdefault(run_id, []).extend([result["began"], result["ended"]])
        return sorted((min(times), max(times)) for times in by_run.values())

    moments = sorted([(start, 1) for start, _ in spans(limited)] + [(end, -1) for _, end in spans(limited)])
    in_hand, most = 0, 0
    for _, change in moments:  # an end sorts before a start at the same instant
        in_hand += change
        most = max(most, in_hand)
    assert most == 3  # reached, never passed
    runs = spans(acme)
    assert all(end <= start for (_, end), (start, _) in zip(runs, runs[1:], strict=False)), runs


def test_rate_limited_steps_keep_their_rate_and_their_turns_make_no_two_phase_commit(
    workers: Workers, far: Any
) -> None:
    """15 runs whose booking step is limited to 5 a second per carrier, two --loop workers: the turns are recorded
    on the coordinator (run_rate_turn) and a run that must wait is handed back on its own shard, each its own
    commit, so no two-phase commit; no second of the carrier's clock holds more than 5 bookings, each run books
    once, and the last books at least 2 s after the first (15 at 5 a second: runs waited for their turns)."""
    from tests.integration.test_rates import MARGIN, _bookings, _most_in_a_window

    durableruns.start("rated", {"carrier": "warm"}, run_id="warm-r")  # the plan's first record: a reference table
    workers.run("--once", timeout=60)
    before = two_phase_commits()
    runs = [durableruns.start("rated", {"carrier": "dhl"}) for _ in range(15)]
    for name in ("w1", "w2"):
        workers.start("--loop", "--concurrency", "4", "--interval", "0.5", "--worker", name, **MARGIN)
    wait_until(
        lambda: RunState.objects.filter(pk__in=runs, status="completed").count() == 15,
        timeout=90,
        what="every run completed",
    )
    workers.stop_all()
    assert two_phase_commits() == before, query("SELECT gid FROM pg_dist_transaction ORDER BY gid")
    times = _bookings(far, runs)
    assert _most_in_a_window(times) <= 5
    assert times[-1] - times[0] >= 2


def test_an_idle_worker_listens_on_the_coordinator_and_a_start_or_an_event_wakes_it(workers: Workers, far: Any) -> None:
    """LISTEN works through the coordinator: with a 30 s poll, a new run and an event are each worked at once."""
    worker = workers.start("--loop", "--interval", "30", "--concurrency", "2")
    wait_until(
        lambda: bool(query("SELECT 1 FROM pg_stat_activity WHERE query = 'LISTEN durableruns_due'")),
        what="the worker to listen",
    )
    durableruns.start("waiting", {"total": 5, "cool_off": 0.1}, run_id="woken")
    wait_until(lambda: RunState.objects.get(pk="woken").status == "waiting", timeout=10, what="the run to be worked")
    durableruns.send("woken", "supplier_confirmed", {"ref": "x"})
    wait_until(lambda: RunState.objects.get(pk="woken").status == "completed", timeout=10, what="the event's wake")
    worker.terminate()
    out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert "listening on durableruns_due" in out
