"""runs_health: each exit status (0 ok, 1 warning, 2 critical) in a set-up that causes it; --json parses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from importlib import import_module
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from durableruns.clock import Clock
from durableruns.models import RunState, RunStatus, RunStep, StepStatus, WorkerPresence
from tests.conftest import CITUS_LANE, ROOT
from tests.ops.records import aged_run, escalate, stopped_by_crash_budget

pytestmark = pytest.mark.django_db(transaction=True)

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def health(*args: str) -> tuple[int, str]:
    """The exit status and stdout of runs_health."""
    out = StringIO()
    try:
        call_command("runs_health", *args, stdout=out, stderr=StringIO())
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def test_all_well_exits_zero_with_one_ok_line():
    aged_run(RunStatus.COMPLETED, days=3)
    aged_run(RunStatus.PENDING, seconds=10)  # due, but only just: a worker will take it
    status, out = health()
    assert status == 0
    assert out.startswith("OK durableruns: no problem")
    assert len(out.splitlines()) == 1


@pytest.mark.parametrize(("hours", "expected"), [(2, 0), (5, 1), (30, 2)])
def test_an_open_escalation_warns_after_four_hours_and_is_critical_after_a_day(hours, expected):
    run = aged_run(RunStatus.NEEDS_DECISION, days=0)
    escalate(run, opened_ago=timedelta(hours=hours))
    status, out = health()
    assert status == expected, out
    if expected:
        [line] = out.splitlines()
        assert line.startswith(("WARNING", "CRITICAL")[expected - 1] + " escalation: 1 escalation(s) open")
        assert run in line


def test_a_decided_escalation_is_no_problem():
    run = aged_run(RunStatus.PENDING, seconds=5)
    escalate(run, opened_ago=timedelta(days=3), decided=True)
    status, out = health()
    assert status == 0, out


def test_the_thresholds_are_options_and_settings(settings):
    run = aged_run(RunStatus.NEEDS_DECISION)
    escalate(run, opened_ago=timedelta(minutes=30))
    assert health()[0] == 0
    assert health("--escalation-warning", "600")[0] == 1
    assert health("--escalation-warning", "600", "--escalation-critical", "1200")[0] == 2
    settings.DURABLERUNS_HEALTH_ESCALATION_WARNING_SECONDS = 60
    assert health()[0] == 1


@pytest.mark.parametrize("kind", ["pending", "waiting past its wake time", "running under an expired lease"])
@pytest.mark.parametrize(("minutes", "expected"), [(2, 0), (10, 1), (20, 2)])
def test_runs_due_with_no_worker_taking_them(kind, minutes, expected):
    since = Clock().now() - timedelta(minutes=minutes)
    run = aged_run(RunStatus.PENDING)
    if kind == "pending":
        RunState.objects.filter(pk=run).update(updated_at=since)
    elif kind.startswith("waiting"):
        RunState.objects.filter(pk=run).update(status=RunStatus.WAITING, wake_at=since)
    else:
        RunState.objects.filter(pk=run).update(status=RunStatus.RUNNING, lease_expires_at=since, owner="gone")
    status, out = health()
    assert status == expected, out
    if expected:
        [line] = out.splitlines()
        assert " due: 1 run(s) due for longer than 5m 0s" in line
        assert "is any resume_runs worker running?" in line


def test_a_waiting_run_whose_wake_time_has_not_come_is_not_due():
    run = aged_run(RunStatus.WAITING, days=2)
    RunState.objects.filter(pk=run).update(wake_at=Clock().now() + timedelta(hours=1))
    assert health()[0] == 0


def _in_hand(run: str, *, step: str, started_minutes_ago: float) -> None:
    """A live worker holding `run` whose attempt at `step` started that long ago (its lease freshly renewed)."""
    now = Clock().now()
    RunState.objects.filter(pk=run).update(
        status=RunStatus.RUNNING, owner="host:42", epoch=3, lease_expires_at=now + timedelta(seconds=30)
    )
    RunStep.objects.create(
        run_id=run,
        step=step,
        attempt=1,
        status=StepStatus.STARTED,
        effect_key=f"{run}:{step}",
        started_at=now - timedelta(minutes=started_minutes_ago),
        owner="host:42",
        epoch=3,
    )


@pytest.mark.parametrize(("minutes", "expected"), [(1, 0), (3, 1), (12, 2)])
def test_a_run_stuck_past_its_steps_timeout(minutes, expected):
    run = aged_run(RunStatus.PENDING)
    _in_hand(run, step="second", started_minutes_ago=minutes)  # `second` declares a 30 s timeout
    status, out = health()
    assert status == expected, out
    if expected:
        [line] = out.splitlines()
        assert f"stuck: 1 run(s) running longer than their step's timeout plus 1m 0s; worst: run {run}" in line
        assert "its 30s timeout, held by host:42" in line


def test_a_stale_attempt_of_an_earlier_epoch_is_not_the_step_in_hand():
    run = aged_run(RunStatus.PENDING, attempts=0)
    _in_hand(run, step="second", started_minutes_ago=1)
    RunStep.objects.create(
        run_id=run,
        step="first",
        attempt=1,
        status=StepStatus.STARTED,
        effect_key="k",
        started_at=Clock().now() - timedelta(hours=2),
        owner="old",
        epoch=1,
    )
    assert health()[0] == 0


def test_json_prints_the_same_report():
    stuck = aged_run(RunStatus.PENDING)
    _in_hand(stuck, step="second", started_minutes_ago=5)
    waiting = aged_run(RunStatus.NEEDS_DECISION)
    escalate(waiting, opened_ago=timedelta(days=2))
    status, out = health("--json")
    report = json.loads(out)
    assert status == 2 and report["exit"] == 2 and report["status"] == "critical"
    by_check = {p["check"]: p for p in report["problems"]}
    assert set(by_check) == {"escalation", "stuck"}
    assert by_check["escalation"]["level"] == "critical" and by_check["escalation"]["runs"] == [waiting]
    assert by_check["stuck"]["level"] == "warning" and by_check["stuck"]["runs"] == [stuck]
    assert by_check["escalation"]["oldest_seconds"] >= 2 * 86400
    assert report["skipped"] == {}
    _, text = health()
    assert [line.split(":")[0] for line in text.splitlines()] == ["CRITICAL escalation", "WARNING stuck"]


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DATABASE_URL": _url(), "DURABLERUNS_WORKFLOW_MODULES": "tests.workflows", **env},
    )


def _url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.mark.postgres
@pytest.mark.parametrize(("offset", "expected"), [("+15s", 1), ("-45s", 2)])
def test_a_host_clock_far_from_the_databases_is_a_warning_then_critical(offset, expected):
    """The real command on a host whose wall clock is moved (libfaketime): exit statuses as cron's shell sees."""
    if not LIBFAKETIME.exists():
        pytest.fail(f"{LIBFAKETIME} is missing: bin/setup --services installs Debian's faketime package")
    proc = _manage("runs_health", LD_PRELOAD=str(LIBFAKETIME), FAKETIME=offset, DONT_FAKE_MONOTONIC="1")
    assert proc.returncode == expected, proc.stdout + proc.stderr
    [line] = proc.stdout.splitlines()
    side = "ahead of" if offset.startswith("+") else "behind"
    assert line.startswith(("WARNING", "CRITICAL")[expected - 1] + " skew: this host's clock is")
    assert side in line


@pytest.mark.postgres
def test_the_real_command_exits_zero_when_all_is_well():
    proc = _manage("runs_health", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["status"] == "ok"


@pytest.mark.postgres
def test_an_unreachable_database_is_critical():
    proc = _manage("runs_health", DATABASE_URL="postgres://postgres@127.0.0.1:1/nowhere")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.startswith("CRITICAL database: the database cannot be read")


def test_live_workers_that_fell_back_to_polling_or_whose_clock_is_off_are_named():
    now = Clock().now()

    def worker(name: str, *, pickup: str, skew: float = 0.0, seen_ago: float = 1, stopped: bool = False) -> None:
        WorkerPresence.objects.create(
            name=name,
            threads=4,
            pickup=pickup,
            skew_seconds=skew,
            started_at=now,
            seen_at=now - timedelta(seconds=seen_ago),
            stopped_at=now if stopped else None,
        )

    worker("host-a:1", pickup="listening on durableruns_due")
    status, out = health()
    assert status == 0, out
    worker("host-b:2", pickup="polling (listener lost: server closed the connection)")
    worker("host-c:3", pickup="polling (listener lost: gone)", seen_ago=600)  # silent for 10 min: not live
    worker("host-d:4", pickup="polling (listener lost: gone)", stopped=True)  # stopped: not live
    status, out = health()
    assert status == 1 and "WARNING listener: 1 worker(s) fell back to polling: host-b:2" in out, out
    worker("host-f:6", pickup="polling (notifications do not arrive: behind a transaction pooler)")
    status, out = health()
    assert status == 1 and "WARNING listener: 2 worker(s) fell back to polling: " in out, out
    assert "host-b:2 (polling (listener lost" in out and "host-f:6 (polling (notifications do not arrive" in out
    worker("host-e:5", pickup="listening on durableruns_due", skew=120.0)
    status, out = health()
    assert status == 2 and "CRITICAL skew: worker host-e:5's clock is 120.0s ahead of the database's" in out, out


def test_a_run_stopped_for_staff_with_no_escalation_is_reported_at_once_with_its_reason(settings):
    run = stopped_by_crash_budget(settings)
    status, out = health()  # the default thresholds: reported at once, critical after 4 hours
    assert status == 1, out
    [line] = out.splitlines()
    assert line.startswith("WARNING stopped: 1 run(s) stopped for staff with no escalation (1 crash budget)")
    assert f"run {run}: first ended in doubt 1 times" in line and "crash budget of 1 is used up" in line
    # With the thresholds at 0 (the review's set-up; skew left alone: any host is some way off), it is there too
    zero = [arg for check in ("escalation", "stopped", "due", "stuck") for arg in (f"--{check}-warning", "0")]
    assert "WARNING stopped: 1 run(s) stopped for staff with no escalation (1 crash budget)" in health(*zero)[1]
    report = json.loads(health("--json")[1])
    [problem] = report["problems"]
    assert problem["check"] == "stopped" and problem["runs"] == [run]
    assert problem["reasons"] == {run: RunState.objects.get(pk=run).reason}
    RunState.objects.filter(pk=run).update(updated_at=Clock().now() - timedelta(hours=5))
    assert health()[0] == 2
    assert health("--stopped-warning", "21600", "--stopped-critical", "86400")[0] == 0
    # Once an escalation is open on it, the escalation check speaks for it instead
    escalate(run, opened_ago=timedelta(hours=5))
    status, out = health()
    assert status == 1 and out.startswith("WARNING escalation"), out


def test_every_kind_of_stop_is_named(settings):
    from durableruns.ops.health import stop_kind
    from durableruns.plans import STOPPED_MARK
    from durableruns.worker.pool import REFUSED_MARK

    crashed = RunState.objects.get(pk=stopped_by_crash_budget(settings)).reason
    assert stop_kind(crashed) == "crash_budget"
    assert stop_kind(f"{STOPPED_MARK}x of the run's plan") == "lacking_steps"
    assert stop_kind(f"{REFUSED_MARK}DataError: value too long)") == "data_refused"
    assert stop_kind("the lookup of pay raised 3 times in a row, its budget of 3; ...") == "lookup_budget"
    assert stop_kind("something else") == "other"


def test_a_trigger_missing_or_disabled_is_critical_and_named():
    """Triggers the record relies on (the finished runs' counts; on PostgreSQL also letting parked runs go and
    result()'s wake), missing after a restore or disabled by hand: critical, naming each and what stopped. On a
    Citus-distributed record, which keeps only run_state_wake_by_deadline (Citus refuses to disable a trigger of a
    distributed table), that one dropped."""
    counting = import_module("durableruns.migrations.0018_run_count")
    deadline = import_module("durableruns.migrations.0025_run_state_deadline")
    postgres = connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        if CITUS_LANE:
            cursor.execute("SET citus.enable_unsafe_triggers = on")
            cursor.execute("DROP TRIGGER run_state_wake_by_deadline ON run_state")
        elif postgres:
            cursor.execute("ALTER TABLE run_state DISABLE TRIGGER run_state_slot_freed")
        else:
            cursor.execute("DROP TRIGGER run_state_count_update")
    try:
        status, out = health()
    finally:
        with connection.cursor() as cursor:
            if CITUS_LANE:  # the trigger again (its function is still there), a statement at a time for Citus
                for statement in deadline.POSTGRES_FORWARD.split("END $$;")[1].split(";"):
                    if statement.strip():
                        cursor.execute(statement)
            elif postgres:
                cursor.execute("ALTER TABLE run_state ENABLE TRIGGER run_state_slot_freed")
            else:
                cursor.execute(counting.SQLITE_TRIGGERS[1])
    assert status == 2
    (line,) = [line for line in out.splitlines() if line.startswith("CRITICAL triggers:")]
    if CITUS_LANE:
        assert "run_state_wake_by_deadline" in line and "slot_freed" not in line and "count_" not in line
    elif postgres:
        assert "run_state_slot_freed: letting parked runs go" in line and "count_update" not in line
    else:
        assert "run_state_count_update: the finished runs' counts" in line and "count_insert" not in line
    assert health()[0] == 0
