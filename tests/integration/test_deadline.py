"""A run's deadline (issue 32): recorded at start from the database's clock, a waiting run woken at it, and a run
past it ended cancelled or failed with a reason naming it (children cancelled, what it holds given back, a worker
inside a step fenced out), by the claim that takes it or by the watchdog's sweep.

In process on PostgreSQL and SQLite, the database's clock moved past the deadline (Clock(shift=...)); with real
worker processes and deadlines of seconds on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.core import mail

import durableruns
from durableruns import deadlines, services, store
from durableruns.children import child_run_id
from durableruns.clock import Clock
from durableruns.errors import DeclarationError, FencedOut, InvalidInput
from durableruns.models import Intervention, RunState, RunStatus, RunStep, WorkerPresence
from durableruns.ops import alerts
from durableruns.store.cancels import SYSTEM_ACTOR
from tests.conftest import wait_until
from tests.integration import deadline_flows  # noqa: F401  (declares the workflows)

pytestmark = pytest.mark.django_db(transaction=True)

# Past the in-process deadline (30 minutes, deadline_flows.DEADLINE), within a lease of three hours.
LATER = Clock(shift=timedelta(hours=1))


def run(run_id: str) -> RunState:
    return RunState.objects.get(pk=run_id)


def resume(run_id: str | None = None, clock: Clock | None = None) -> None:
    services.resume_due(run_id=run_id, clock=clock)


def settle(clock: Clock, *, passes: int = 5) -> None:
    for _ in range(passes):
        resume(clock=clock)


def assert_ended_at_deadline(run_id: str, status: str, span: str) -> RunState:
    row = run(run_id)
    assert row.status == status, (row.status, row.reason)
    assert row.reason.startswith(f"deadline of {span} passed at {row.deadline_at.astimezone(UTC):%Y-%m-%d %H:%M:%S}")
    act = Intervention.objects.get(run_id=run_id, decided_by=SYSTEM_ACTOR)
    assert act.user_id is None and act.note == row.reason
    return row


def test_the_deadline_is_counted_from_the_start_on_the_databases_clock():
    run_id = durableruns.start("deadline_long", {})
    row = run(run_id)
    assert row.deadline_at - row.created_at == timedelta(minutes=30)
    assert row.on_deadline == "cancel"
    # start(deadline=) overrides the workflow's; what it ends as is still the workflow's
    other = run(durableruns.start("deadline_long_fail", {}, deadline=timedelta(seconds=90)))
    assert other.deadline_at - other.created_at == timedelta(seconds=90) and other.on_deadline == "fail"
    # a workflow without a deadline records none
    assert run(durableruns.start("deadline_child", {})).deadline_at is None


def test_start_with_an_aware_datetime_and_the_sentence_names_it():
    at = datetime(2031, 1, 2, 15, 30, tzinfo=UTC)
    run_id = durableruns.start("deadline_none", {}, deadline=at)
    row = run(run_id)
    assert row.deadline_at == at and row.on_deadline == "cancel"
    assert "deadline 2031-01-02 15:30 UTC" in durableruns.boundary(run_id).sentence()
    assert durableruns.boundary(run_id).deadline == at
    resume(run_id)
    assert run(run_id).status == RunStatus.WAITING and run(run_id).wake_at == at  # no timeout: woken at the deadline
    # a run without one says nothing of it
    assert "deadline" not in durableruns.boundary(durableruns.start("deadline_child", {})).sentence()


@pytest.mark.parametrize("deadline", [datetime(2031, 1, 2, 15, 30), timedelta(0), timedelta(seconds=-5), "3 days", 60])
def test_a_bad_deadline_at_start_is_invalid_input_and_records_nothing(deadline):
    with pytest.raises(InvalidInput, match="deadline"):
        durableruns.start("deadline_none", {}, run_id="refused", deadline=deadline)
    assert not RunState.objects.filter(pk="refused").exists()


@pytest.mark.parametrize("kwargs", [{"deadline": timedelta(0)}, {"deadline": timedelta(days=-1)}, {"deadline": 3},
                                    {"on_deadline": "stop"}, {"deadline": timedelta(days=1), "on_deadline": None}])
def test_a_bad_deadline_declaration_is_a_declaration_error(kwargs):
    with pytest.raises(DeclarationError):
        durableruns.Workflow("deadline_bad", **kwargs)


def test_a_wait_for_an_event_with_no_timeout_wakes_at_its_deadline_and_ends_cancelled():
    run_id = durableruns.start("deadline_event", {})
    resume(run_id)
    row = run(run_id)
    assert row.status == RunStatus.WAITING and row.wake_at == row.deadline_at
    resume()  # not due before it
    assert run(run_id).status == RunStatus.WAITING
    resume(clock=LATER)  # the claim takes it past its deadline and ends it
    row = assert_ended_at_deadline(run_id, RunStatus.CANCELLED, "30 minutes")
    assert row.lease_expires_at is None  # its worker let go at once
    assert "deadline" not in durableruns.boundary(run_id).sentence()  # ended: the sentence no longer names it


def test_a_sleep_of_an_hour_ends_failed_at_its_deadline():
    run_id = durableruns.start("deadline_sleep", {})
    resume(run_id)
    row = run(run_id)
    assert row.status == RunStatus.WAITING and row.wake_at == row.deadline_at  # earlier than the hour's end
    resume(clock=LATER)
    assert_ended_at_deadline(run_id, RunStatus.FAILED, "30 minutes")
    assert not RunStep.objects.filter(run_id=run_id, status="completed").exists()


def test_its_children_are_cancelled():
    parent = durableruns.start("deadline_parent", {})
    settle(store.DATABASE)
    child = child_run_id(parent, "start_child", "only")
    assert run(parent).status == RunStatus.WAITING and run(child).status == RunStatus.WAITING
    settle(LATER)
    assert_ended_at_deadline(parent, RunStatus.CANCELLED, "30 minutes")
    assert run(child).status == RunStatus.CANCELLED
    assert run(child).reason.startswith(f"cancelled with {parent}: deadline of 30 minutes passed at")


def test_a_child_run_takes_its_own_workflows_deadline():
    parent = durableruns.start("deadline_starter", {})
    settle(store.DATABASE)
    # one started in a commit of its own (a resolvable step), one with the step's result (re-executable)
    children = [child_run_id(parent, "start_timed_child", "timed"), child_run_id(parent, "start_timed_child_too",
                                                                               "timed_too")]
    for child in children:
        row = run(child)
        assert row.status == RunStatus.WAITING and row.on_deadline == "fail"
        assert abs(row.deadline_at - row.created_at - timedelta(minutes=30)) < timedelta(seconds=1)
        assert row.wake_at == row.deadline_at
    assert run(parent).deadline_at is None
    settle(LATER)
    for child in children:
        assert_ended_at_deadline(child, RunStatus.FAILED, "30 minutes")


def test_what_it_holds_is_given_back_before_it_ends(far):
    run_id = durableruns.start("deadline_holder", {})
    settle(store.DATABASE)
    assert run(run_id).status == RunStatus.WAITING and len(far.warehouse.held()) == 1
    settle(LATER)
    assert_ended_at_deadline(run_id, RunStatus.CANCELLED, "30 minutes")
    assert far.warehouse.held() == [] and len(far.warehouse.releases()) == 1
    assert run(run_id).ending == ""


def test_the_sweep_fences_out_a_worker_inside_a_step():
    run_id = durableruns.start("deadline_long", {})
    claimed = store.claim(owner="w1", lease_seconds=3 * 3600)
    assert claimed is not None and claimed.lease.run_id == run_id and not claimed.overdue
    assert deadlines.sweep() == []  # not past it yet
    assert deadlines.sweep(clock=LATER) == [run_id]
    assert_ended_at_deadline(run_id, RunStatus.CANCELLED, "30 minutes")
    with pytest.raises(FencedOut):  # the worker inside the step writes nothing more
        store.renew(claimed.lease)
    assert deadlines.sweep(clock=LATER) == []  # once
    assert Intervention.objects.filter(run_id=run_id).count() == 1


def test_the_sweep_leaves_a_run_a_claim_will_take_to_the_claim():
    run_id = durableruns.start("deadline_event", {})
    assert deadlines.sweep(clock=LATER) == []  # pending: the claim ends it
    claimed = store.claim(owner="w1", lease_seconds=30, clock=LATER)
    assert claimed is not None and claimed.lease.run_id == run_id and claimed.overdue


def test_the_alerts_say_so_once(settings, django_user_model):
    settings.DURABLERUNS_ADMIN_BASE_URL = "https://ops.example.com/"
    django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-9f3")
    run_id = durableruns.start("deadline_sleep", {})
    resume(run_id)
    assert alerts.send_deadline_alerts().due == 0  # not ended yet
    resume(clock=LATER)
    report = alerts.send_alerts()
    assert report.deadlines.sent == [(run_id, ("root@example.com",))]
    assert "mailed 1 run(s) ended at their deadline" in report.summary()
    [message] = mail.outbox
    assert message.subject == f"[durableruns] {run_id}: failed at its deadline"
    assert f"Why: {run(run_id).reason}" in message.body and "deadline of 30 minutes passed at" in message.body
    assert alerts.send_alerts().deadlines.sent == [] and len(mail.outbox) == 1  # once


# -- real worker processes (PostgreSQL) ------------------------------------------------------------------------

MODULES = "tests.workflows,tests.integration.deadline_flows"


def _worker(workers, folder: Path, *args: str):
    """A --loop worker that sweeps every half second, up (reporting its presence) before the test starts a run:
    the deadlines are seconds long, and a worker still booting when one passes would only ever see it passed."""
    proc = workers.start("--loop", "--interval", "0.2", *args, DURABLERUNS_WORKFLOW_MODULES=MODULES,
                         DEADLINE_DIR=str(folder), DURABLERUNS_STUCK_MARGIN_SECONDS="1")
    wait_until(WorkerPresence.objects.exists, timeout=60, what="the worker to be up")
    return proc


@pytest.mark.postgres
@pytest.mark.parametrize(("workflow", "status"), [("deadline_long", RunStatus.CANCELLED),
                                                  ("deadline_long_fail", RunStatus.FAILED)])
def test_a_worker_inside_a_long_step_is_fenced_out_at_the_deadline(workers, tmp_path, workflow, status):
    _worker(workers, tmp_path, "--lease", "20")
    run_id = durableruns.start(workflow, {}, deadline=timedelta(seconds=4))
    wait_until(lambda: (tmp_path / f"entered-{run_id}").exists(), timeout=60, what="the long step to begin")
    wait_until(lambda: run(run_id).status == status, timeout=30, what=f"the run to end {status} at its deadline")
    row = assert_ended_at_deadline(run_id, status, "4 seconds")
    assert row.updated_at >= row.deadline_at
    (tmp_path / f"open-{run_id}").touch()  # the step returns now; its worker's result is fenced out
    wait_until(lambda: (tmp_path / f"left-{run_id}").exists(), timeout=30, what="the long step to return")
    wait_until(lambda: run(run_id).lease_expires_at is None, timeout=30, what="its worker to let go")
    assert run(run_id).status == status
    assert not RunStep.objects.filter(run_id=run_id, step="long_step", status="completed").exists()
    assert not (tmp_path / f"after-{run_id}").exists()


@pytest.mark.postgres
@pytest.mark.parametrize(("workflow", "status"), [("deadline_event", RunStatus.CANCELLED),
                                                  ("deadline_sleep", RunStatus.FAILED)])
def test_a_waiting_run_ends_at_its_deadline(workers, tmp_path, workflow, status):
    _worker(workers, tmp_path)
    run_id = durableruns.start(workflow, {}, deadline=timedelta(seconds=3))
    wait_until(lambda: run(run_id).status == RunStatus.WAITING, timeout=60, what="the run to wait")
    assert run(run_id).wake_at == run(run_id).deadline_at
    wait_until(lambda: run(run_id).status == status, timeout=30, what=f"the run to end {status} at its deadline")
    row = assert_ended_at_deadline(run_id, status, "3 seconds")
    assert row.updated_at >= row.deadline_at


@pytest.mark.postgres
def test_a_worker_ends_a_parent_at_its_deadline_and_cancels_its_child(workers, tmp_path):
    _worker(workers, tmp_path)
    parent = durableruns.start("deadline_parent", {}, deadline=timedelta(seconds=3))
    child = child_run_id(parent, "start_child", "only")
    wait_until(lambda: RunState.objects.filter(pk=child).exists(), timeout=30, what="the child to be started")
    wait_until(lambda: RunState.objects.filter(pk=parent, status=RunStatus.CANCELLED).exists(), timeout=60,
               what="the parent to end at its deadline")
    assert_ended_at_deadline(parent, RunStatus.CANCELLED, "3 seconds")
    assert run(child).status == RunStatus.CANCELLED
