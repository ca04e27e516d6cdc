"""The backend for Django's Tasks: enqueue records a run, resume_runs works it, get_result reads it back."""

from __future__ import annotations

import signal
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings

from durableruns import services, store
from durableruns.models import RunState, RunStatus, RunStep, StepStatus
from durableruns.tasks import WORKFLOW, DurableRunsBackend, TaskResultDoesNotExist, TaskResultStatus
from tests.conftest import wait_until
from tests.tasks import jobs

pytestmark = [pytest.mark.django_db(transaction=True)]


def work(**kwargs) -> None:
    services.resume_due(**kwargs)


def test_the_configured_backend_is_durableruns():
    assert isinstance(jobs.add.get_backend(), DurableRunsBackend)


def test_enqueue_inside_a_rolled_back_transaction_records_no_run():
    class Undone(Exception):
        pass

    with pytest.raises(Undone), transaction.atomic():
        result = jobs.add.enqueue(1, 2)
        assert RunState.objects.filter(pk=result.id).exists()  # in the caller's transaction, seen inside it
        raise Undone
    assert not RunState.objects.filter(pk=result.id).exists()
    with transaction.atomic():
        kept = jobs.add.enqueue(1, 2)
    assert RunState.objects.get(pk=kept.id).workflow == WORKFLOW


def test_enqueue_on_commit_records_the_run_only_once_the_caller_commits():
    options = {
        "default": {
            "BACKEND": "durableruns.tasks.DurableRunsBackend",
            "QUEUES": [],
            "OPTIONS": {"ENQUEUE_ON_COMMIT": True},
        }
    }
    with override_settings(TASKS=options):
        with transaction.atomic():
            result = jobs.add.enqueue(1, 2)
            assert not RunState.objects.filter(pk=result.id).exists()
        assert RunState.objects.filter(pk=result.id).exists()
        with pytest.raises(RuntimeError), transaction.atomic():
            undone = jobs.add.enqueue(1, 2)
            raise RuntimeError
        assert not RunState.objects.filter(pk=undone.id).exists()


def test_get_result_of_a_task_that_returned():
    result = jobs.add.enqueue(2, 3, times=2)
    assert result.status == TaskResultStatus.READY
    assert jobs.add.get_result(result.id).status == TaskResultStatus.READY
    work()
    done = jobs.add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.is_finished
    assert done.return_value == {"total": 10}
    assert (done.args, done.kwargs, done.errors, done.attempts) == ([2, 3], {"times": 2}, [], 1)
    assert done.enqueued_at <= done.started_at <= done.finished_at
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == {"total": 10}


def test_get_result_of_a_task_that_raised_names_its_class_and_traceback():
    result = jobs.explode.enqueue("boom at the far end")
    work()
    failed = jobs.explode.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED and failed.is_finished
    [error] = failed.errors
    assert error.exception_class_path == "builtins.ValueError" and error.exception_class is ValueError
    assert error.traceback.startswith("Traceback (most recent call last):")
    assert "raise ValueError(message)" in error.traceback
    assert error.traceback.rstrip().endswith("ValueError: boom at the far end")
    with pytest.raises(ValueError, match="Task failed"):
        failed.return_value  # noqa: B018
    assert RunState.objects.get(pk=result.id).status == RunStatus.FAILED


def test_the_tasks_signals_are_sent_for_each_attempt():
    from durableruns.tasks import task_enqueued, task_finished, task_started

    seen: list[tuple[str, str, str, object]] = []

    def note(name):
        def receiver(sender, task_result, **kwargs):
            assert sender is DurableRunsBackend
            error = task_result.errors[-1].exception_class_path if task_result.errors else None
            value = task_result.return_value if task_result.status == TaskResultStatus.SUCCESSFUL else error
            seen.append((name, task_result.id, task_result.status, value))

        return receiver

    receivers = {
        sent: note(name)
        for sent, name in ((task_enqueued, "enqueued"), (task_started, "started"), (task_finished, "finished"))
    }
    for sent, receiver in receivers.items():
        sent.connect(receiver)
    try:
        added, failed = jobs.add.enqueue(2, 3), jobs.explode.enqueue("boom")
        work()
    finally:
        for sent, receiver in receivers.items():
            sent.disconnect(receiver)
    assert seen == [
        ("enqueued", added.id, TaskResultStatus.READY, None),
        ("enqueued", failed.id, TaskResultStatus.READY, None),
        ("started", added.id, TaskResultStatus.RUNNING, None),
        ("finished", added.id, TaskResultStatus.SUCCESSFUL, {"total": 5}),
        ("started", failed.id, TaskResultStatus.RUNNING, None),
        ("finished", failed.id, TaskResultStatus.FAILED, "builtins.ValueError"),
    ]


def test_get_result_of_no_such_task():
    with pytest.raises(TaskResultDoesNotExist):
        jobs.add.get_backend().get_result("no-such-task")


def test_a_task_that_takes_its_context_sees_its_attempt():
    result = jobs.which_attempt.enqueue()
    work()
    assert jobs.which_attempt.get_result(result.id).return_value == 1


@pytest.mark.postgres
def test_run_after_defers_the_task_by_the_database_clock():
    later = store.DATABASE.now() + timedelta(seconds=2)
    deferred = jobs.add.using(run_after=later).enqueue(1, 1)
    now = jobs.add.enqueue(1, 2)
    work()
    assert jobs.add.get_result(now.id).status == TaskResultStatus.SUCCESSFUL
    waiting = RunState.objects.get(pk=deferred.id)
    assert (waiting.status, waiting.wake_at) == (RunStatus.WAITING, later)
    assert jobs.add.get_result(deferred.id).status == TaskResultStatus.READY
    assert jobs.add.get_result(deferred.id).task.run_after == later
    wait_until(lambda: store.DATABASE.now() >= later, timeout=10, what="the run_after on the database's clock")
    work()
    assert jobs.add.get_result(deferred.id).return_value == {"total": 2}


def test_higher_priority_first_among_due_tasks():
    ids = [jobs.add.using(priority=p).enqueue(p, 0).id for p in (-5, 0, 10, 0, 3)]
    work(concurrency=1)
    started = RunStep.objects.filter(run_id__in=ids).order_by("started_at").values_list("run_id", flat=True)
    assert list(started) == [ids[2], ids[4], ids[1], ids[3], ids[0]]  # priority, then the oldest


def test_start_takes_a_priority_too():
    low = services.start_run("scripted", {}, priority=-1)
    high = services.start_run("scripted", {}, priority=7)
    first = store.claim(owner="w", lease_seconds=30)
    second = store.claim(owner="w", lease_seconds=30)
    assert (first.lease.run_id, second.lease.run_id) == (high, low)


def test_resume_runs_limited_to_queues_takes_only_theirs():
    ids = {q: jobs.add.using(queue_name=q).enqueue(1, 1).id for q in ("default", "reports", "mail")}
    call_command("resume_runs", "--once", "--queue", "reports", "--queue", "mail", stdout=StringIO())
    status = dict(RunState.objects.filter(pk__in=ids.values()).values_list("run_id", "status"))
    assert status == {
        ids["default"]: RunStatus.PENDING,
        ids["reports"]: RunStatus.COMPLETED,
        ids["mail"]: RunStatus.COMPLETED,
    }
    call_command("resume_runs", "--once", stdout=StringIO())  # default: every queue
    assert RunState.objects.get(pk=ids["default"]).status == RunStatus.COMPLETED


@pytest.mark.postgres
def test_a_worker_killed_inside_a_task_runs_it_again_after_the_lease_and_records_its_result_once(workers, tmp_path):
    result = jobs.hang_the_first_time.enqueue(str(tmp_path))
    first = workers.start("--loop", "--lease", "2", "--worker", "doomed")
    wait_until((tmp_path / "first-start").exists, timeout=60, what="the task to start in the first worker")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    killed_at = time.monotonic()
    second = workers.start("--loop", "--lease", "2", "--worker", "heir", "--interval", "0.2")
    wait_until(
        lambda: jobs.hang_the_first_time.get_result(result.id).is_finished,
        timeout=60,
        what="the task to finish in the second worker",
    )
    assert time.monotonic() - killed_at >= 1.0  # not before the dead worker's lease ran out
    second.send_signal(signal.SIGTERM)
    second.communicate(timeout=30)
    done = jobs.hang_the_first_time.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 2
    assert len((tmp_path / "starts").read_text().splitlines()) == 2  # ran again, once
    attempts = list(RunStep.objects.filter(run_id=result.id).order_by("attempt").values_list("status", "owner"))
    assert [status for status, _ in attempts] == [StepStatus.STARTED, StepStatus.COMPLETED]  # one result
    assert attempts[0][1].startswith("doomed") and attempts[1][1].startswith("heir")
    assert done.worker_ids == [owner for _, owner in attempts]


@pytest.mark.postgres
def test_max_attempts_retries_a_task_that_raised_before_it_fails(workers):
    result = jobs.explode.enqueue("boom")
    done = workers.run(
        "--loop", "--max-seconds", "5", DURABLERUNS_TASK_MAX_ATTEMPTS="3", DURABLERUNS_RETRY_BACKOFF_SECONDS="0.2"
    )
    assert done.returncode == 0, done.stderr
    failed = jobs.explode.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in failed.errors] == ["builtins.ValueError"] * 3
    assert failed.attempts == 3
    starts = list(RunStep.objects.filter(run_id=result.id).order_by("attempt").values_list("started_at", flat=True))
    gaps = [(later - earlier).total_seconds() for earlier, later in zip(starts, starts[1:], strict=False)]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4, gaps  # the backoff, doubling


def test_dry_run_lists_a_queue_s_due_runs_in_claim_order():
    low = jobs.add.using(queue_name="reports", priority=-1).enqueue(1, 1).id
    high = jobs.add.using(queue_name="reports", priority=5).enqueue(1, 1).id
    other = jobs.add.enqueue(1, 1).id
    out = StringIO()
    call_command("resume_runs", "--dry-run", "--queue", "reports", stdout=out)
    text = out.getvalue()
    assert other not in text and text.index(high) < text.index(low), text
    assert "dry run: 2 run(s) due; nothing changed" in text
