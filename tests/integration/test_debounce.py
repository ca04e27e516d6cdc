"""Debounced starts (issue 35): `start(..., debounce=, key=)` keeps one run per key until it begins, with the last
input, due `debounce` after the last start by the database's clock; once begun, the key starts a new run."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connections

import durableruns
from durableruns import services
from durableruns.clock import Clock
from durableruns.errors import InvalidInput
from durableruns.models import RunState, RunStatus, RunStep
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_starts_with_one_key_make_one_run_with_the_last_input_due_after_the_last_start():
    first = durableruns.start("requote", {"order": 17, "edit": 0}, debounce=timedelta(seconds=30), key="order-17")
    created = RunState.objects.get(pk=first).created_at
    for edit in range(1, 5):
        again = durableruns.start("requote", {"order": 17, "edit": edit}, debounce=timedelta(seconds=30),
                                  key="order-17")
        assert again == first
    last_start = Clock().now()
    run = RunState.objects.get(pk=first)
    assert RunState.objects.filter(workflow="requote").count() == 1
    assert run.input == {"order": 17, "edit": 4} and run.status == RunStatus.WAITING
    assert run.created_at == created  # the run was recorded by the first start; its start moved with each
    assert last_start + timedelta(seconds=29) < run.wake_at <= last_start + timedelta(seconds=30)
    assert "debounced" in run.reason and "debounced" in durableruns.boundary(first).sentence()
    # Not due before then: a pass leaves it.
    assert not services.resume_due().outcomes
    # Another key, or another workflow's same key, is a run of its own.
    other = durableruns.start("requote", {"order": 18}, debounce=timedelta(seconds=30), key="order-18")
    assert other != first
    # Its time comes: it runs once, with the last input.
    services.resume_due(clock=Clock(shift=timedelta(seconds=31)))
    assert RunState.objects.get(pk=first).status == RunStatus.COMPLETED
    assert RunStep.objects.get(run_id=first, step="requote_lines").result == {"edit": 4, "order": 17}
    assert RunState.objects.get(pk=first).debounce_key is None
    # Once begun, the key starts a new run.
    later = durableruns.start("requote", {"order": 17, "edit": 5}, debounce=timedelta(seconds=30), key="order-17")
    assert later != first and RunState.objects.get(pk=later).input["edit"] == 5


def test_a_cancelled_run_not_yet_begun_is_not_replaced():
    first = durableruns.start("requote", {"edit": 1}, debounce=timedelta(seconds=30), key="k")
    services.cancel_run(first, by="ann", note="not wanted")
    second = durableruns.start("requote", {"edit": 2}, debounce=timedelta(seconds=30), key="k")
    assert second != first
    assert RunState.objects.get(pk=first).status == RunStatus.CANCELLED
    assert RunState.objects.get(pk=first).input == {"edit": 1}


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"debounce": timedelta(seconds=3)}, "key="),
        ({"key": "k"}, "debounce="),
        ({"debounce": timedelta(0), "key": "k"}, "positive"),
        ({"debounce": 3, "key": "k"}, "timedelta"),
        ({"debounce": timedelta(seconds=3), "key": ""}, "non-empty"),
        ({"debounce": timedelta(seconds=3), "key": "x" * 201}, "200"),
        ({"debounce": timedelta(seconds=3), "key": "a\nb"}, "control character"),
    ],
)
def test_a_bad_debounce_is_refused_and_records_nothing(kwargs, says):
    with pytest.raises(InvalidInput, match=says):
        durableruns.start("requote", {}, **kwargs)
    assert not RunState.objects.exists()


def test_concurrent_starts_with_one_key_leave_exactly_one_run():
    """8 threads, each with its own connection, start with one key at once (a barrier): one run, every thread
    answered with its id, and its input one of theirs."""
    barrier = threading.Barrier(8)
    answers: list[str] = []
    errors: list[BaseException] = []

    def start(n: int) -> None:
        try:
            barrier.wait()
            for round in range(3):
                answers.append(durableruns.start("requote", {"edit": n * 10 + round}, debounce=timedelta(seconds=30),
                                                 key="burst"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=start, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(answers) == 24 and len(set(answers)) == 1
    run = RunState.objects.get(workflow="requote")
    assert run.pk == answers[0] and run.input["edit"] in {n * 10 + 2 for n in range(8)} | {
        n * 10 + r for n in range(8) for r in range(3)}


@pytest.mark.postgres
def test_a_burst_of_twenty_starts_runs_once_about_the_debounce_after_the_last(workers):
    """Twenty starts with one key over about two seconds, debounce 3 s, a `--loop` worker idle beside them: one
    run, with the last input, whose step starts 3 s (and a little) after the last start by the database's clock;
    a start after it began makes a second run."""
    workers.start("--loop", "--concurrency", "2", "--interval", "0.5")
    ids = set()
    for edit in range(20):
        time.sleep(0.1)
        last_start = Clock().now()
        ids.add(durableruns.start("requote", {"edit": edit}, debounce=timedelta(seconds=3), key="order-17"))
    (run_id,) = ids
    due = RunState.objects.get(pk=run_id).wake_at  # read before the worker takes it (it clears wake_at)
    assert timedelta(seconds=3) <= due - last_start <= timedelta(seconds=3.1)
    wait_until(lambda: RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED, timeout=20,
               what="the debounced run to complete")
    step = RunStep.objects.get(run_id=run_id, step="requote_lines")
    assert step.result["edit"] == 19
    late = (step.started_at - due).total_seconds()
    assert 0 <= late <= 1.5, late  # taken when it came due (the idle worker's timer), not polled for
    second = durableruns.start("requote", {"edit": 20}, debounce=timedelta(seconds=3), key="order-17")
    assert second != run_id
    assert RunState.objects.filter(workflow="requote").count() == 2


def test_a_run_that_began_and_waits_again_is_not_replaced():
    """A run begun and now asleep (waiting, like a run not begun) keeps its input: the claim that began it let go
    of its key, so the next start with the key is a new run."""
    first = durableruns.start("sleeper", {"seconds": 3600, "edit": 1}, debounce=timedelta(seconds=1), key="nap-1")
    services.resume_due(clock=Clock(shift=timedelta(seconds=2)))
    assert RunStep.objects.filter(run_id=first, step="nap").exists()
    assert RunState.objects.get(pk=first).status == RunStatus.WAITING
    second = durableruns.start("sleeper", {"seconds": 3600, "edit": 2}, debounce=timedelta(seconds=1), key="nap-1")
    assert second != first
    assert RunState.objects.get(pk=first).input["edit"] == 1
