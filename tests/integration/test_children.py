"""Child runs, worked in-process on the real database (PostgreSQL, and SQLite: none of these needs row locks).

A shipping run books each warehouse as a child run (`booking`, a counted effect under the child's own key), joins
them, and reads their results; the carrier's ledger shows a doubled child or booking.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.admin.utils import quote
from django.core.management import call_command
from django.db import connection

import durableruns
from durableruns import services, store, testing
from durableruns.children import child_run_id
from durableruns.clock import Clock
from durableruns.errors import InvalidInput
from durableruns.models import Escalation, Intervention, RunState, RunStatus, RunStep
from durableruns.waits import JOIN_RECHECK
from project.purchasing.far import FarSystems
from tests.conftest import CITUS_LANE
from tests.workflows import warehouses

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_backoff(settings):
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0


def status(run_id: str) -> str:
    return RunState.objects.values_list("status", flat=True).get(pk=run_id)


def kids(run_id: str) -> dict[str, str]:
    return dict(RunState.objects.children_of(run_id).values_list("run_id", "status"))


def test_three_children_started_joined_and_read(far: FarSystems) -> None:
    run_id = durableruns.start("shipping", warehouses("north", "south", "east", again=True), run_id="ship-1")
    services.resume_due()
    assert status(run_id) == RunStatus.COMPLETED
    expected = [child_run_id(run_id, "book_warehouses", n) for n in ("east", "north", "south")]
    assert list(kids(run_id)) == expected and set(kids(run_id).values()) == {RunStatus.COMPLETED}
    (joined,) = RunStep.objects.filter(run_id=run_id, step="bookings")
    assert joined.status == "completed" and joined.resolution == "children"
    for child in expected:
        assert joined.result[child]["status"] == "completed"
        booked = joined.result[child]["results"]["book"]
        assert booked == far.carrier.lookup(f"{child}:book")
        assert joined.result[child]["results"]["confirm_booking"]["booked"] == booked
    (ship,) = RunStep.objects.filter(run_id=run_id, step="ship_order")
    assert ship.result == {"statuses": dict.fromkeys(expected, "completed")}
    assert far.carrier.count() == 3 and not far.carrier.duplicates()
    # the parent's step asked for "north" twice with the same input: one child, the same run_id returned
    (spawned,) = RunStep.objects.filter(run_id=run_id, step="book_warehouses")
    assert spawned.result["children"][-1] == spawned.result["children"][0]
    detail = services.boundary_of(RunState.objects.get(pk=run_id))
    assert detail.status == RunStatus.COMPLETED


def test_a_step_run_again_starts_nothing_twice_and_other_input_under_a_key_is_refused(far: FarSystems) -> None:
    run_id = durableruns.start("shipping", warehouses("north", "south", raise_once=True), run_id="ship-again")
    services.resume_due()
    attempts = list(RunStep.objects.filter(run_id=run_id, step="book_warehouses").values_list("attempt", "status"))
    assert attempts == [(1, "failed"), (2, "completed")]
    assert status(run_id) == RunStatus.COMPLETED and len(kids(run_id)) == 2
    assert far.carrier.count() == 2 and not far.carrier.duplicates()

    # The same key with another input (or another workflow) is another child: refused, nothing written.
    lease = store.Lease(run_id=run_id, owner="test", epoch=RunState.objects.get(pk=run_id).epoch, seconds=30)
    from durableruns import children

    assert children.start(lease, "book_warehouses", "booking", {"warehouse": "north"}, key="north") == \
        child_run_id(run_id, "book_warehouses", "north")
    with pytest.raises(InvalidInput, match="another workflow or input"):
        children.start(lease, "book_warehouses", "booking", {"warehouse": "north", "fail": True}, key="north")
    with pytest.raises(InvalidInput, match="at most 200"):
        children.start(lease, "book_warehouses", "booking", {}, key="k" * 200)
    assert len(kids(run_id)) == 2

    # A child of a limited workflow counts under its limit as a run start() made would: its key asked once.
    keyed = children.start(lease, "book_warehouses", "keyed", {"buyer": "acme"}, key="acme")
    limited = children.start(lease, "book_warehouses", "limited", {"n": 1}, key="one")
    unlimited = child_run_id(run_id, "book_warehouses", "north")
    recorded = dict(RunState.objects.filter(pk__in=[keyed, limited, unlimited]).values_list("pk", "concurrency_key"))
    assert recorded == {keyed: "acme", limited: "", unlimited: None}


@pytest.mark.parametrize(("workflow", "parent", "reason"), [
    ("shipping", RunStatus.FAILED, "bookings: child run fail-shipping/book_warehouses/south failed"),
    ("shipping_continue", RunStatus.COMPLETED, ""),
])
def test_a_failed_child_fails_the_parent_or_shows_in_its_results(far: FarSystems, workflow: str, parent: str,
                                                                 reason: str) -> None:
    run_id = durableruns.start(workflow, warehouses("north", "south", each={"south": {"fail": True}}),
                               run_id=f"fail-{workflow}")
    services.resume_due()
    south = child_run_id(run_id, "book_warehouses", "south")
    assert kids(run_id)[south] == RunStatus.FAILED
    run = RunState.objects.get(pk=run_id)
    assert run.status == parent
    if reason:
        assert run.reason.startswith(reason) and "no carrier serves south" in run.reason
    else:
        (ship,) = RunStep.objects.filter(run_id=run_id, step="ship_order")
        assert ship.result["statuses"][south] == "failed"
        assert ship.result["statuses"][child_run_id(run_id, "book_warehouses", "north")] == "completed"


def test_an_escalated_child_holds_the_join_until_staff_decide_it(far: FarSystems) -> None:
    run_id = durableruns.start("shipping", warehouses("north", "south", each={"south": {"doubt": True}}),
                               run_id="ship-doubt")
    services.resume_due()
    south = child_run_id(run_id, "book_warehouses", "south")
    assert kids(run_id)[south] == RunStatus.NEEDS_DECISION
    assert status(run_id) == RunStatus.WAITING
    services.resume_due()  # nothing moves the join while the child waits for staff
    parent = RunState.objects.get(pk=run_id)
    assert parent.status == RunStatus.WAITING
    services.resume_due(clock=Clock(shift=JOIN_RECHECK * 2))  # its recheck finds the child still undecided
    assert status(run_id) == RunStatus.WAITING
    assert "waiting for its child runs at bookings" in services.run_boundary(run_id).sentence()
    durableruns.decide(south, "confirm_booking", "happened", by="ops", note="the warehouse confirmed by phone",
                       result={"warehouse": "south", "booked": "by phone"})
    services.resume_due()  # the child completes and its end makes the parent due; the parent completes
    assert status(south) == RunStatus.COMPLETED and status(run_id) == RunStatus.COMPLETED
    (joined,) = RunStep.objects.filter(run_id=run_id, step="bookings")
    assert joined.result[south]["results"]["confirm_booking"] == {"warehouse": "south", "booked": "by phone"}


def test_cancelling_a_parent_cancels_its_unfinished_children(far: FarSystems) -> None:
    run_id = durableruns.start("shipping", warehouses("north", "south", "east", each={"south": {"doubt": True}}),
                               run_id="ship-cancel")
    # The parent's first pass starts the children and waits; one child is run to its end, one escalates.
    services.resume_due(run_id=run_id)
    north, south, east = (child_run_id(run_id, "book_warehouses", n) for n in ("north", "south", "east"))
    services.resume_due(run_id=north)
    services.resume_due(run_id=south)
    assert kids(run_id) == {east: RunStatus.PENDING, north: RunStatus.COMPLETED, south: RunStatus.NEEDS_DECISION}
    services.cancel_run(run_id, by="ops", note="the buyer withdrew the order")
    assert status(run_id) == RunStatus.CANCELLED
    assert kids(run_id) == {east: RunStatus.CANCELLED, north: RunStatus.COMPLETED, south: RunStatus.CANCELLED}
    assert "with ship-cancel: the buyer withdrew" in RunState.objects.get(pk=east).reason
    # the escalated child's open escalation is closed by its cancel, as a staff cancel of it would
    assert not Escalation.objects.open().filter(run_id=south).exists()
    assert Intervention.objects.filter(run_id=south, action="cancel").exists()
    services.resume_due()
    assert far.carrier.count() == 2  # north's and south's bookings; east never ran


def test_the_admin_and_the_api_show_a_runs_parent_and_children(far: FarSystems, admin_client) -> None:
    run_id = durableruns.start("shipping", warehouses("north", "south"), run_id="ship-shown")
    services.resume_due(run_id=run_id)  # the children exist, pending; the parent waits at its join
    north, south = (child_run_id(run_id, "book_warehouses", n) for n in ("north", "south"))
    page = admin_client.get(f"/admin/durableruns/runstate/{quote(run_id)}/change/").content.decode()
    for child in (north, south):
        assert f'href="/admin/durableruns/runstate/{quote(child)}/change/"' in page
    assert page.count('data-relation="child"') == 2 and "pending" in page
    child_page = admin_client.get(f"/admin/durableruns/runstate/{quote(north)}/change/").content.decode()
    assert f'href="/admin/durableruns/runstate/{quote(run_id)}/change/"' in child_page
    assert 'data-relation="parent"' in child_page

    detail = admin_client.get(f"/api/runs/{run_id}/").json()
    assert detail["parent"] is None
    assert detail["children"] == [{"run_id": north, "workflow": "booking", "status": "pending"},
                                  {"run_id": south, "workflow": "booking", "status": "pending"}]
    assert admin_client.get(f"/api/runs/{north}/").json()["parent"] == {
        "run_id": run_id, "workflow": "shipping", "status": "waiting"}


def test_show_run_lists_a_runs_children_and_names_a_childs_parent(far: FarSystems) -> None:
    run_id = durableruns.start("shipping", warehouses("north", "south"), run_id="ship-told")
    services.resume_due(run_id=run_id)  # the children exist, pending; the parent waits at its join
    north, south = (child_run_id(run_id, "book_warehouses", n) for n in ("north", "south"))

    def shown(run: str) -> str:
        out = StringIO()
        call_command("show_run", run, stdout=out)
        return out.getvalue()

    assert f"children (2):\n  {north} (booking): pending\n  {south} (booking): pending\n" in shown(run_id)
    assert f"  child of {run_id} (shipping: waiting)\n" in shown(north)
    assert "children" not in shown(north) and "child of" not in shown(run_id)


def lock_waits(watcher, blocker) -> int:
    """How many sessions of this database wait on a lock, the blocker's aside. On a Citus cluster a statement on a
    run's row waits on the node holding the run's shard: citus_stat_activity shows every node's sessions."""
    if CITUS_LANE:
        sql = "SELECT count(*) FROM citus_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        return int(watcher.execute(sql).fetchone()[0])
    sql = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> %s "
           "AND datname = current_database()")
    return int(watcher.execute(sql, [blocker.info.backend_pid]).fetchone()[0])


@pytest.mark.postgres
def test_two_last_children_ending_at_once_still_wake_their_parent_at_once(far: FarSystems) -> None:
    """Two last children end at the same moment: each end's statement sees the other still running, so neither
    wakes the parent in its own statement. The one that commits last asks again after its commit, with a snapshot
    taken then, and wakes it: the parent is due at once, not at its join's recheck a minute later.

    Forced: child B's last statement starts (its snapshot taken) and waits on B's row, locked by another session;
    meanwhile child A ends and commits; then B's statement goes on, seeing A as its snapshot had it, running."""
    import psycopg

    from durableruns.connections import plain_params

    run_id = durableruns.start("shipping", warehouses("north", "south"), run_id="ship-race")
    services.resume_due(run_id=run_id)  # the children exist, pending; the parent waits at its join
    a, b = (child_run_id(run_id, "book_warehouses", n) for n in ("north", "south"))
    b_at_its_end, row_locked = threading.Event(), threading.Event()

    def hook(point: str, step: str) -> None:
        if threading.current_thread().name == "child-b" and (point, step) == ("after_return", "confirm_booking"):
            b_at_its_end.set()
            row_locked.wait(10)

    def work_b() -> None:
        try:
            services.resume_due(run_id=b)
        finally:
            connection.close()

    testing.arm(hook)
    try:
        with psycopg.connect(**plain_params("default")) as blocker:
            child_b = threading.Thread(target=work_b, name="child-b")
            child_b.start()
            assert b_at_its_end.wait(30)
            blocker.execute("SELECT 1 FROM run_state WHERE run_id = %s FOR UPDATE", [b])  # held until commit
            row_locked.set()
            deadline = time.monotonic() + 10
            with psycopg.connect(**plain_params("default"), autocommit=True) as watcher:
                while lock_waits(watcher, blocker) < 1:
                    assert time.monotonic() < deadline, "child B's last statement never waited on its row"
                    time.sleep(0.01)
            services.resume_due(run_id=a)  # A ends and commits while B's statement waits
            assert status(a) == RunStatus.COMPLETED
            parent = RunState.objects.get(pk=run_id)
            assert parent.wake_at > Clock().now()  # A saw B running, before and after its commit: no wake yet
            blocker.commit()  # B's statement goes on
            child_b.join(30)
    finally:
        testing.arm(None)
    assert status(b) == RunStatus.COMPLETED
    parent = RunState.objects.get(pk=run_id)
    assert parent.status == RunStatus.WAITING and parent.wake_at <= Clock().now()  # due now, not at the recheck
    services.resume_due(run_id=run_id)
    assert status(run_id) == RunStatus.COMPLETED
    (joined,) = RunStep.objects.filter(run_id=run_id, step="bookings")
    assert {child: r["status"] for child, r in joined.result.items()} == {a: "completed", b: "completed"}


# -- a parent that ends cancelled, every way, and one that fails (issue 30, item 3) ------------------------------


def _guardian(end: str, run_id: str) -> tuple[str, list[str]]:
    """A guardian parent whose two children are napping (an hour) when it reaches the way it ends."""
    durableruns.start("guardian", {"end": end}, run_id=run_id)
    services.resume_due(run_id=run_id)  # starts its children, then goes on to its ending
    nappers = [child_run_id(run_id, "start_nappers", n) for n in (0, 1)]
    for child in nappers:
        services.resume_due(run_id=child)
    assert {status(c) for c in nappers} == {RunStatus.WAITING}
    return run_id, nappers


def _end_parent(end: str, run_id: str) -> None:
    if end == "reject":
        services.decide(run_id, "go_ahead", "reject", by="manager", note="over budget")
    elif end == "abandon":
        assert Escalation.objects.open().filter(run_id=run_id).exists()
        services.decide(run_id, "call_the_supplier", "abandon", by="ops", note="the supplier gave up")
    elif end == "cancel":
        services.cancel_run(run_id, by="ops", note="the buyer withdrew")
    services.resume_due(run_id=run_id)


@pytest.mark.parametrize("end", ["reject", "abandon", "cancel"])
def test_every_way_a_parent_ends_cancelled_cancels_its_napping_children_before_they_act(far: FarSystems,
                                                                                       end: str) -> None:
    run_id, nappers = _guardian(end, f"guard-{end}")
    _end_parent(end, run_id)
    assert status(run_id) == RunStatus.CANCELLED
    for child in nappers:
        row = RunState.objects.get(pk=child)
        assert row.status == RunStatus.CANCELLED and f"with {run_id}" in row.reason, row.reason
        assert Intervention.objects.filter(run_id=child, action="cancel").exists()
    services.resume_due(clock=Clock(shift=timedelta(hours=2)))  # past every nap
    assert far.carrier.count() == 0  # before: a rejected or abandoned parent's children woke and booked


def test_a_failed_parent_leaves_its_children_going_on(far: FarSystems) -> None:
    run_id, nappers = _guardian("fail", "guard-fail")
    assert status(run_id) == RunStatus.FAILED
    services.resume_due(clock=Clock(shift=timedelta(hours=2)))
    assert {status(c) for c in nappers} == {RunStatus.COMPLETED} and far.carrier.count() == 2  # as documented


@pytest.mark.parametrize("end", ["reject", "abandon"])
def test_a_child_holding_a_reservation_gives_it_back_then_ends_cancelled_with_its_parent(far: FarSystems,
                                                                                         end: str) -> None:
    run_id = f"guard-holds-{end}"
    durableruns.start("guardian", {"end": end, "holder": True, "naps": [3600]}, run_id=run_id)
    services.resume_due(run_id=run_id)
    holder = child_run_id(run_id, "start_nappers", 0)
    services.resume_due(run_id=holder)  # it reserves, then naps
    assert status(holder) == RunStatus.WAITING and len(far.warehouse.held()) == 1
    _end_parent(end, run_id)
    assert RunState.objects.get(pk=holder).ending == RunStatus.CANCELLED  # a worker gives it back first
    services.resume_due()
    assert status(holder) == RunStatus.CANCELLED and far.warehouse.held() == []
    assert len(far.warehouse.releases()) == 1


# -- a child recorded while its parent is being cancelled (issue 30, item 4) -------------------------------------


@pytest.mark.postgres
def test_a_child_recorded_while_its_parent_is_being_cancelled_is_cancelled_too(far: FarSystems) -> None:
    """The staff cancel reads the parent's descendants, then waits for the parent's row; a child recorded in that
    gap (its insert holds the parent's row) is in the record when the cancel goes on, and is cancelled with it.

    Forced with real sessions: the parent's step has returned; another session holds the parent's row, so the
    step's result commit (which records the children) waits on it; the cancel then reads no child and queues on
    the row behind it; the holder commits, the children are recorded, then the cancel goes on."""
    import psycopg

    from durableruns.connections import plain_params

    run_id = durableruns.start("shipping", warehouses("north"), run_id="ship-gap")
    north = child_run_id(run_id, "book_warehouses", "north")
    returned, row_locked = threading.Event(), threading.Event()

    def hook(point: str, step: str) -> None:
        if threading.current_thread().name == "parent" and (point, step) == ("after_return", "book_warehouses"):
            returned.set()
            row_locked.wait(10)

    def in_thread(name: str, work) -> threading.Thread:
        def run() -> None:
            try:
                work()
            finally:
                connection.close()

        thread = threading.Thread(target=run, name=name)
        thread.start()
        return thread

    def until_waiting(watcher, blocker, n: int, what: str) -> None:
        deadline = time.monotonic() + 10
        while lock_waits(watcher, blocker) < n:
            assert time.monotonic() < deadline, what
            time.sleep(0.01)

    testing.arm(hook)
    try:
        with (psycopg.connect(**plain_params("default")) as blocker,
              psycopg.connect(**plain_params("default"), autocommit=True) as watcher):
            parent = in_thread("parent", lambda: services.resume_due(run_id=run_id))
            assert returned.wait(30)
            blocker.execute("SELECT 1 FROM run_state WHERE run_id = %s FOR UPDATE", [run_id])
            row_locked.set()
            until_waiting(watcher, blocker, 1, "the step's result commit never waited on the parent's row")
            assert not RunState.objects.filter(pk=north).exists()
            cancel = in_thread("cancel", lambda: services.cancel_run(run_id, by="ops", note="withdrawn"))
            until_waiting(watcher, blocker, 2, "the cancel never waited on the parent's row")
            blocker.commit()  # the result commit goes first (it queued first), then the cancel
            cancel.join(30)
            parent.join(30)
    finally:
        testing.arm(None)
    assert status(run_id) == RunStatus.CANCELLED
    assert status(north) == RunStatus.CANCELLED  # before: pending, and worked to its booking below
    services.resume_due()
    assert far.carrier.count() == 0
