"""Waits under SIGKILL: a real worker killed at every point around a wait (before the commit that consumes the
event and completes the wait, after it, and inside the step after it), then resumed by another worker.

Each event is consumed exactly once, by the wait's one completed attempt; the step after it sees the payload;
the email it sends goes out once per run (staff settle the in-doubt email by the outbox, as its docstring says).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

import durableruns
from durableruns import services
from durableruns.models import Escalation, RunEvent, RunState, RunStatus, RunStep
from project.purchasing.far import FarSystems
from tests.conftest import Workers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.slow]

POINTS = (
    ("supplier_confirmed", "before_complete"),  # the consumption not committed
    ("supplier_confirmed", "after_complete"),  # committed, the next step not begun
    ("cool_off", "before_complete"),  # a sleep whose time has come, its completion not committed
    ("cool_off", "after_complete"),
    ("notify_buyer", "before_intent"),  # inside the step after the waits
    ("notify_buyer", "after_intent"),
    ("notify_buyer", "after_effect"),
    ("notify_buyer", "after_return"),
)


@dataclass(frozen=True)
class Case:
    step: str
    point: str

    @property
    def run_id(self) -> str:
        return f"wait-crash-{self.step}-{self.point}"


def test_a_worker_killed_around_a_wait_consumes_each_event_once_and_doubles_no_effect(
    far: FarSystems, workers: Workers
) -> None:
    cases = [Case(step, point) for step, point in POINTS]
    for case in cases:
        # cool_off 0: the sleep's time has come when the worker reaches it, so it completes in that pass
        durableruns.start("waiting", {"total": 5, "cool_off": 0}, run_id=case.run_id)
    services.resume_due()  # each run reaches its wait for the supplier's confirmation
    assert RunState.objects.filter(status=RunStatus.WAITING).count() == len(cases)
    for case in cases:
        assert durableruns.send(case.run_id, "supplier_confirmed", {"ref": case.run_id}, key="webhook-1")

    crashers = {
        case: workers.start("--run", case.run_id, "--lease", "1", "--worker", f"doomed-{case.point}",
                            DURABLERUNS_CRASH_AT=f"{case.step}@{case.point}")
        for case in cases
    }
    for case, proc in crashers.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == -9, f"{case}: the worker was not killed (exit {proc.returncode}):\n{out}{err}"
    # A partner's webhook retried meanwhile is recorded once.
    for case in cases:
        assert durableruns.send(case.run_id, "supplier_confirmed", {"ref": "retried"}, key="webhook-1") is False

    time.sleep(1.5)  # the killed workers' leases run out
    deadline = time.monotonic() + 90
    while RunState.objects.filter(pk__in=[c.run_id for c in cases]).exclude(status=RunStatus.COMPLETED).exists():
        assert time.monotonic() < deadline, list(RunState.objects.values_list("run_id", "status", "reason"))
        result = workers.run("--once", timeout=60)
        assert result.returncode == 0, result.stderr
        # staff settle an email left in doubt the way its docstring says: look in the outbox for the run id
        for escalation in Escalation.objects.open():
            sent = [e for e in far.email.effects() if e["payload"]["subject"] == f"{escalation.run_id}:confirmed"]
            if sent:
                durableruns.decide(escalation.run_id, escalation.step, "happened", by="ops", note="in the outbox",
                                   result={"sent": sent[0]["id"], "saw": {"ref": escalation.run_id}})
            else:
                durableruns.decide(escalation.run_id, escalation.step, "did_not_happen", by="ops",
                                   note="not in the outbox")
        time.sleep(1.1)

    for case in cases:
        (event,) = RunEvent.objects.filter(run_id=case.run_id)
        waits = list(RunStep.objects.filter(run_id=case.run_id, step="supplier_confirmed").values_list(
            "attempt", "status", "result"))
        assert waits == [(1, "completed", {"ref": case.run_id})], f"{case}: {waits}"
        assert (event.consumed_step, event.consumed_attempt) == ("supplier_confirmed", 1), case
        sleeps = RunStep.objects.filter(run_id=case.run_id, step="cool_off", status="completed").count()
        assert sleeps == 1, case
        notified = RunStep.objects.filter(run_id=case.run_id, step="notify_buyer", status="completed").get()
        assert notified.result["saw"] == {"ref": case.run_id}, case
        emails = [e for e in far.email.effects() if e["payload"]["subject"] == f"{case.run_id}:confirmed"]
        assert len(emails) == 1, f"{case}: {len(emails)} emails"
