"""durableruns.signals: each is sent once its fact is committed, with its documented arguments; never on a
rollback; a receiver that raises never harms the run; with no receivers no extra query is made."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from durableruns import errors, services, signals
from durableruns.models import Escalation, RunState, RunStatus, RunStep
from tests.factories import crash_after_intent, make_run

pytestmark = pytest.mark.django_db(transaction=True)

ALL = (
    "run_started",
    "run_completed",
    "run_failed",
    "run_cancelled",
    "step_in_doubt",
    "attempt_failed",
    "escalation_opened",
    "escalation_decided",
)


class Heard(list[tuple[str, type, dict[str, Any]]]):
    def named(self, name: str) -> list[dict[str, Any]]:
        return [arguments for signal, _, arguments in self if signal == name]

    def names(self) -> list[str]:
        return [signal for signal, _, _ in self]


@pytest.fixture
def heard(settings) -> Iterator[Heard]:
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0
    got = Heard()
    receivers = {}
    for name in ALL:

        def receiver(sender: type, signal: Any, _name: str = name, **arguments: Any) -> None:
            got.append((_name, sender, arguments))

        receivers[name] = receiver
        getattr(signals, name).connect(receiver, weak=False)
    yield got
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


def test_a_run_worked_to_the_end_sends_started_then_completed(heard):
    run = make_run("scripted")
    assert heard == [("run_started", RunState, {"run_id": run, "workflow": "scripted"})]
    services.resume_due()
    assert heard.names() == ["run_started", "run_completed"]
    assert heard.named("run_completed") == [{"run_id": run, "workflow": "scripted"}]


def test_start_inside_a_transaction_that_rolls_back_sends_nothing(heard):
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        make_run("scripted", run_id="never")
        raise ZeroDivisionError("the caller's own work fails after the start")
    assert not RunState.objects.filter(pk="never").exists()
    assert heard == []


def test_start_inside_a_transaction_sends_only_when_it_commits(heard):
    with transaction.atomic():
        run = make_run("scripted")
        assert heard == []  # not yet: the caller may still roll back
    assert heard.named("run_started") == [{"run_id": run, "workflow": "scripted"}]


def test_a_duplicate_start_sends_nothing(heard):
    make_run("scripted", run_id="once")
    with pytest.raises(errors.DuplicateRun):
        make_run("scripted", run_id="once")
    assert heard.names() == ["run_started"]


def test_a_run_whose_step_keeps_being_rejected_sends_failed_with_the_reason(heard):
    run = make_run("scripted", {"first": "reject"})
    services.resume_due()
    assert RunState.objects.get(pk=run).status == RunStatus.FAILED
    assert [(a["step"], a["attempt"]) for a in heard.named("attempt_failed")] == [
        ("first", 1),
        ("first", 2),
        ("first", 3),
    ]
    assert all(a["run_id"] == run and "first refused" in a["error"] for a in heard.named("attempt_failed"))
    [failed] = heard.named("run_failed")
    assert failed["run_id"] == run and failed["workflow"] == "scripted"
    assert "first refused" in failed["reason"]
    assert heard.named("run_completed") == []


def test_a_failed_run_that_gave_back_its_holds_sends_failed_once_released(heard, far):
    run = make_run("holding", {"pay": "reject"})  # lock and reserve acquired, then pay refused twice
    services.resume_due()
    assert RunState.objects.get(pk=run).status == RunStatus.FAILED
    assert len(far.warehouse.releases()) == 2
    [failed] = heard.named("run_failed")
    assert failed["run_id"] == run and failed["workflow"] == "holding" and "pay" in failed["reason"]


def test_a_crashed_attempt_sends_in_doubt_and_an_escalation_opened(heard):
    run = make_run("scripted")
    services.resume_due()  # completed: now craft a run that dies in its escalate-policy step
    run = make_run("scripted")
    crash_after_intent(run, "third", cursor=2)
    heard.clear()
    services.resume_due(run_id=run)
    [doubt] = heard.named("step_in_doubt")
    assert doubt == {
        "run_id": run,
        "workflow": "scripted",
        "step": "third",
        "attempt": 1,
        "effect_key": f"{run}:third",
        "policy": "escalate",
        "cause": "",
    }
    escalation = Escalation.objects.get(run_id=run)
    [opened] = heard.named("escalation_opened")
    assert opened == {
        "escalation_id": escalation.pk,
        "run_id": run,
        "step": "third",
        "attempt": 1,
        "reason": escalation.reason,
    }
    assert heard.names() == ["step_in_doubt", "escalation_opened"]


def test_a_call_that_raised_without_an_answer_is_in_doubt_with_its_cause(heard):
    run = make_run("scripted", {"third": "boom"})
    services.resume_due()
    [doubt] = heard.named("step_in_doubt")
    assert doubt["step"] == "third" and "connection reset" in doubt["cause"]
    assert len(heard.named("escalation_opened")) == 1
    assert RunState.objects.get(pk=run).status == RunStatus.NEEDS_DECISION


def test_a_decision_sends_escalation_decided_and_abandon_sends_cancelled(heard):
    run = make_run("scripted", {"third": "boom"})
    services.resume_due()
    escalation = Escalation.objects.get(run_id=run)
    heard.clear()
    services.resolve_escalation(escalation.pk, "abandon", by="alice", note="the customer called it off")
    assert heard.names() == ["escalation_decided", "run_cancelled"]
    assert heard.named("escalation_decided") == [
        {
            "escalation_id": escalation.pk,
            "run_id": run,
            "step": "third",
            "attempt": 1,
            "action": "abandon",
            "by": "alice",
        }
    ]
    [cancelled] = heard.named("run_cancelled")
    assert cancelled["by"] == "alice" and "the customer called it off" in cancelled["reason"]


def test_happened_sends_decided_then_the_resumed_run_completes(heard):
    run = make_run("scripted", {"third": "boom"})
    services.resume_due()
    escalation = Escalation.objects.get(run_id=run)
    services.resolve_escalation(escalation.pk, "happened", by="bob", note="seen in the mailbox", result={})
    assert heard.named("escalation_decided")[0]["action"] == "happened"
    services.resume_due()
    assert heard.named("run_completed") == [{"run_id": run, "workflow": "scripted"}]


def test_a_refused_decision_sends_nothing(heard):
    run = make_run("scripted", {"third": "boom"})
    services.resume_due()
    escalation = Escalation.objects.get(run_id=run)
    services.resolve_escalation(escalation.pk, "did_not_happen", by="bob", note="not sent")
    heard.clear()
    with pytest.raises(errors.AlreadyDecided):
        services.resolve_escalation(escalation.pk, "abandon", by="carol", note="too late")
    assert heard == []


def test_staff_cancel_sends_cancelled_and_closes_the_escalation(heard):
    run = make_run("scripted", {"third": "boom"})
    services.resume_due()
    escalation = Escalation.objects.get(run_id=run)
    heard.clear()
    services.cancel_run(run, by="dora", note="duplicate order")
    assert heard.names() == ["escalation_decided", "run_cancelled"]
    assert heard.named("escalation_decided")[0] == {
        "escalation_id": escalation.pk,
        "run_id": run,
        "step": "third",
        "attempt": 1,
        "action": "cancel",
        "by": "dora",
    }
    assert heard.named("run_cancelled")[0]["by"] == "dora"


def test_a_refused_cancel_sends_nothing(heard):
    run = make_run("scripted")
    services.resume_due()
    heard.clear()
    with pytest.raises(services.RunNotActionable):
        services.cancel_run(run, by="dora", note="too late")
    assert heard == []


def test_a_receiver_that_raises_is_logged_and_the_run_stays_completed(heard, caplog):
    def broken(**_: Any) -> None:
        raise RuntimeError("the integration is down")

    signals.run_completed.connect(broken, weak=False)
    try:
        run = make_run("scripted")
        report = services.resume_due()
    finally:
        signals.run_completed.disconnect(broken)
    assert report.crashed == []
    assert RunState.objects.get(pk=run).status == RunStatus.COMPLETED
    assert RunStep.objects.filter(run_id=run, status="completed").count() == 3
    assert "a receiver of a durableruns signal raised" in caplog.text
    assert heard.named("run_completed") == [{"run_id": run, "workflow": "scripted"}]


def _workflow_reads(queries: list[dict[str, Any]]) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].startswith('SELECT "run_state"."workflow"')]


def test_with_no_receiver_the_finished_run_costs_no_extra_query():
    make_run("scripted")
    with CaptureQueriesContext(connection) as quiet:
        services.resume_due()
    assert _workflow_reads(quiet.captured_queries) == []


def test_with_a_receiver_the_workflow_is_read_once_per_finished_run(heard):
    make_run("scripted")
    with CaptureQueriesContext(connection) as listened:
        services.resume_due()
    assert len(_workflow_reads(listened.captured_queries)) == 1
