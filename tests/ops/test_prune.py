"""prune_runs: exactly the finished runs past their period go, with their attempts; nothing active ever does;
escalated or staff-touched runs stay for their own period; the archive holds what was deleted."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from durableruns.models import Escalation, Intervention, RunState, RunStatus, RunStep
from durableruns.ops import prune
from tests.ops.records import aged_run, escalate, staff_touch

pytestmark = pytest.mark.django_db(transaction=True)

ACTIVE = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.NEEDS_DECISION)


def prune_runs(*args: str) -> str:
    out = StringIO()
    call_command("prune_runs", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def remaining() -> set[str]:
    return set(RunState.objects.values_list("pk", flat=True))


def test_exactly_the_finished_runs_older_than_the_period_go_with_their_attempts_and_nothing_active():
    old = {aged_run(s, days=40, attempts=3) for s in prune.FINISHED}
    young = {aged_run(s, days=20, attempts=2) for s in prune.FINISHED}
    active_old = {aged_run(s, days=400, attempts=1) for s in ACTIVE}
    out = prune_runs("--older-than", "30", "--batch-size", "2")
    assert remaining() == young | active_old
    assert not RunStep.objects.filter(run_id__in=old).exists()
    assert RunStep.objects.filter(run_id__in=young).count() == 6
    assert RunStep.objects.filter(run_id__in=active_old).count() == 4
    assert "deleted 3 run(s) (1 cancelled, 1 completed, 1 failed), 9 attempt(s)" in out
    assert "in 2 batch(es)" in out


def test_the_period_defaults_to_the_setting(settings):
    settings.DURABLERUNS_PRUNE_DAYS = 10
    old = aged_run(RunStatus.COMPLETED, days=11)
    young = aged_run(RunStatus.COMPLETED, days=9)
    prune_runs()
    assert remaining() == {young}
    assert old not in remaining()


def test_status_chooses_which_finished_runs_go():
    completed = aged_run(RunStatus.COMPLETED, days=40)
    failed = aged_run(RunStatus.FAILED, days=40)
    cancelled = aged_run(RunStatus.CANCELLED, days=40)
    prune_runs("--older-than", "30", "--status", "completed,cancelled")
    assert remaining() == {failed}
    assert completed not in remaining() and cancelled not in remaining()


@pytest.mark.parametrize("status", ["pending", "running", "waiting", "needs_decision", "completed,bogus"])
def test_an_active_or_unknown_status_is_a_usage_error(status):
    aged_run(RunStatus.COMPLETED, days=40)
    with pytest.raises(CommandError, match="--status"):
        prune_runs("--older-than", "30", "--status", status)
    assert RunState.objects.count() == 1


def test_the_service_refuses_active_statuses_too():
    run = aged_run(RunStatus.PENDING, days=400)
    with pytest.raises(prune.InvalidInput):
        prune.prune(older_than_days=0, statuses=("completed", "pending"))
    assert remaining() == {run}


def test_escalated_or_staff_touched_runs_are_kept_for_the_evidence_period(settings):
    settings.DURABLERUNS_PRUNE_EVIDENCE_DAYS = 100
    plain = aged_run(RunStatus.COMPLETED, days=50)
    escalated = aged_run(RunStatus.COMPLETED, days=50)
    escalate(escalated, decided=True)
    touched = aged_run(RunStatus.FAILED, days=50)
    staff_touch(touched)
    ancient_escalated = aged_run(RunStatus.CANCELLED, days=150)
    escalate(ancient_escalated, decided=True)
    ancient_touched = aged_run(RunStatus.COMPLETED, days=150)
    staff_touch(ancient_touched)
    out = prune_runs("--older-than", "30")
    assert remaining() == {escalated, touched}
    assert plain not in remaining()
    assert not Escalation.objects.filter(run_id=ancient_escalated).exists()
    assert not Intervention.objects.filter(run_id__in=[ancient_escalated, ancient_touched]).exists()
    assert Escalation.objects.filter(run_id=escalated).count() == 1
    assert Intervention.objects.filter(run_id__in=[escalated, touched]).count() == 2
    assert "1 escalation(s), 2 decision(s)" in out


def test_a_period_longer_than_the_evidence_period_holds_for_evidence_too(settings):
    settings.DURABLERUNS_PRUNE_EVIDENCE_DAYS = 10
    escalated = aged_run(RunStatus.COMPLETED, days=50)
    escalate(escalated)
    plain = aged_run(RunStatus.COMPLETED, days=50)
    prune_runs("--older-than", "60")
    assert remaining() == {escalated, plain}


def test_dry_run_prints_what_would_go_and_deletes_nothing():
    old = aged_run(RunStatus.COMPLETED, days=40, attempts=2)
    aged_run(RunStatus.COMPLETED, days=1)
    before = remaining()
    out = prune_runs("--older-than", "30", "--dry-run", "--verbosity", "2")
    assert remaining() == before
    assert RunStep.objects.count() == 3
    assert f"would delete {old}" in out
    assert "dry run: would delete 1 run(s) (1 completed), 2 attempt(s)" in out
    assert "nothing deleted" in out


def test_the_archive_holds_every_deleted_run_its_attempts_and_decisions(tmp_path: Path):
    plain = aged_run(RunStatus.COMPLETED, days=40, attempts=3)
    decided = aged_run(RunStatus.CANCELLED, days=400, attempts=2)
    escalation = escalate(decided, decided=True)
    kept = aged_run(RunStatus.COMPLETED, days=5)
    expected_attempts = {
        run: sorted(RunStep.objects.filter(run_id=run).values_list("step", "attempt", "result"))
        for run in (plain, decided)
    }
    path = tmp_path / "pruned.jsonl"
    prune_runs("--older-than", "30", "--archive", str(path), "--batch-size", "1")
    assert remaining() == {kept}
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    by_run = {line["run"]["run_id"]: line for line in lines}
    assert set(by_run) == {plain, decided}
    for run, attempts in expected_attempts.items():
        assert sorted((a["step"], a["attempt"], a["result"]) for a in by_run[run]["attempts"]) == attempts
    assert by_run[plain]["run"]["status"] == "completed"
    assert by_run[plain]["escalations"] == [] and by_run[plain]["interventions"] == []
    [archived_escalation] = by_run[decided]["escalations"]
    assert archived_escalation["id"] == escalation.pk and archived_escalation["step"] == "second"
    [decision] = by_run[decided]["interventions"]
    assert decision["escalation_id"] == escalation.pk
    assert (decision["decided_by"], decision["note"], decision["result"]) == ("alice", "checked by phone", {"ok": True})


def test_a_second_pass_appends_to_the_archive(tmp_path: Path):
    path = tmp_path / "pruned.jsonl"
    first = aged_run(RunStatus.COMPLETED, days=40)
    prune_runs("--older-than", "30", "--archive", str(path))
    second = aged_run(RunStatus.FAILED, days=40)
    prune_runs("--older-than", "30", "--archive", str(path))
    assert [json.loads(line)["run"]["run_id"] for line in path.read_text().splitlines()] == [first, second]


@pytest.mark.postgres
def test_a_run_locked_by_another_transaction_is_skipped_not_waited_for():
    """A row some other transaction holds (a staff retry about to make it pending) is left to the next pass."""
    import threading

    from django.db import connection, transaction

    held = aged_run(RunStatus.FAILED, days=40)
    free = aged_run(RunStatus.FAILED, days=40)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic():
            list(RunState.objects.select_for_update().filter(pk=held))
            locked.set()
            release.wait(10)
        connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert locked.wait(10)
        report = prune.prune(older_than_days=30)
    finally:
        release.set()
        thread.join()
    assert report.runs == 1
    assert remaining() == {held}
    assert free not in remaining()


def test_an_archive_that_cannot_be_written_deletes_nothing(tmp_path: Path):
    run = aged_run(RunStatus.COMPLETED, days=40)
    with pytest.raises(CommandError, match="cannot write the archive .*nothing deleted"):
        prune_runs("--older-than", "30", "--archive", str(tmp_path / "no-such-folder" / "pruned.jsonl"))
    assert remaining() == {run}
