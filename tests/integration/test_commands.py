"""resume_runs and show_run as cron and operators use them: options, output, exit statuses."""

from __future__ import annotations

import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from durableruns import engine
from durableruns.models import RunState, RunStatus, RunStep
from tests.conftest import ROOT
from tests.factories import complete, crash_after_intent, make_run

pytestmark = pytest.mark.django_db(transaction=True)


def resume(*args: str) -> str:
    out = StringIO()
    call_command("resume_runs", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, DURABLERUNS_WORKFLOW_MODULES="tests.workflows", **env), timeout=60)


def test_one_line_per_run_and_a_summary_exit_zero_with_outcomes_that_wait():
    done = make_run()
    stuck = make_run()
    complete(stuck, "first", {})
    complete(stuck, "second", {})
    crash_after_intent(stuck, "third", cursor=2)
    out = resume()
    assert f"{done}: completed" in out and f"{stuck}: needs_decision" in out
    assert "2 run(s) handled" in out and "1 completed, 1 needs_decision" in out


def test_dry_run_prints_the_boundary_and_plan_and_changes_nothing():
    fresh = make_run()
    doubt = make_run(input={"lookup": None})
    complete(doubt, "first", {})
    crash_after_intent(doubt, "second", cursor=1)
    before = list(RunState.objects.order_by("pk").values_list("pk", "status", "epoch", "owner"))
    out = resume("--dry-run")
    assert f"{fresh}: 0 steps complete, 3 steps remaining" in out
    assert "would run first (attempt 1)" in out
    assert "second in doubt since" in out and f"would look up second by key {doubt}:second" in out
    assert "2 run(s) due; nothing changed" in out
    assert list(RunState.objects.order_by("pk").values_list("pk", "status", "epoch", "owner")) == before
    assert RunStep.objects.count() == 2


def test_run_and_limit_choose_what_is_worked():
    a, b, c = make_run(), make_run(), make_run()
    out = resume("--run", b)
    assert b in out and a not in out and c not in out
    assert RunState.objects.get(pk=b).status == RunStatus.COMPLETED
    resume("--limit", "1")
    assert RunState.objects.filter(status=RunStatus.COMPLETED).count() == 2


def test_worker_name_is_recorded_and_loop_stops_at_max_seconds():
    run_id = make_run()
    out = resume("--loop", "--interval", "0.05", "--max-seconds", "0.3", "--worker", "cron-host-7")
    assert RunState.objects.get(pk=run_id).owner.split("#")[0] == "cron-host-7"  # #n: its thread, if several
    assert out.count("run(s) handled") == 1  # idle passes say nothing; it stopped by itself


def test_a_run_that_raises_inside_the_engine_exits_3(monkeypatch):
    make_run()

    def broken(self, claimed):
        raise RuntimeError("bug in durableruns")

    monkeypatch.setattr(engine.Engine, "work", broken)
    with pytest.raises(CommandError) as caught:
        resume()
    assert caught.value.returncode == 3 and "1 run(s) raised" in str(caught.value)


def test_show_run_prints_sentence_boundary_and_every_attempt(settings):
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0
    run_id = make_run(input={"first": "reject_once"})
    resume()
    out = StringIO()
    call_command("show_run", run_id, stdout=out)
    text = out.getvalue()
    assert f"{run_id} (scripted): completed" in text and "all 3 steps complete" in text
    assert "first                #1 failed" in text and "first                #2 completed" in text
    assert "Rejected: first refused once" in text
    with pytest.raises(CommandError, match="No run has that run_id"):
        call_command("show_run", "nope", stdout=StringIO())


@pytest.mark.parametrize("args", [["--limit", "0"], ["--once", "--loop"], ["--lease", "abc"], ["--interval", "-1"]])
def test_usage_errors_exit_2(args):
    result = manage("resume_runs", "--skip-checks", *args)
    assert result.returncode == 2, result.stderr
    assert "error:" in result.stderr


def test_a_database_error_exits_non_zero_with_a_clear_message():
    result = manage("resume_runs", "--skip-checks", DATABASE_URL="postgres://postgres@127.0.0.1:1/none")
    assert result.returncode == 1
    assert "database error, pass stopped" in result.stderr and "Traceback" not in result.stderr


def test_the_lease_defaults_to_the_environment_setting():
    result = manage("shell", "-c", "from durableruns import conf; print(conf.lease_seconds())",
                    DURABLERUNS_LEASE_SECONDS="7.5")
    assert result.stdout.strip().splitlines()[-1] == "7.5", result.stderr


def test_resume_runs_checks_every_durableruns_check_at_start():
    """resume_runs runs the checks tagged durableruns (and the models'), not the site's template and URL checks,
    which import every template library and the whole URLconf: a worker renders no page. So every check
    durableruns registers must carry the tag, or resume_runs would start past it."""
    from django.core.checks.registry import registry

    from durableruns.management.commands.resume_runs import Command

    ours = [check for check in registry.get_checks(include_deployment_checks=True)
            if check.__module__.split(".")[0] == "durableruns"]
    assert len(ours) >= 5, ours
    assert [check.__name__ for check in ours if "durableruns" not in check.tags] == []
    assert "durableruns" in Command.requires_system_checks


def test_a_one_step_run_is_its_1_step_complete_and_a_step_that_raised_counts_as_run(monkeypatch):
    monkeypatch.setenv("TEST_HOLD_SECONDS", "0")
    one = make_run("heartbeat_probe")
    out = resume()
    assert f"{one}: completed - its 1 step complete" in out and "all 1 steps" not in out
    assert "1 step(s) run" in out
    refused = make_run("refused")
    out = resume()
    assert f"{refused}: failed" in out
    assert "1 step(s) run" in out  # it ran, and raised: not "0 step(s) run"


def test_nothing_due_while_a_killed_workers_lease_runs_says_until_when(workers):
    """A worker killed inside a step leaves its lease running: the next pass finds nothing due, and says why."""
    held = make_run("heartbeat_probe")
    killed = workers.run("--once", "--lease", "600", DURABLERUNS_CRASH_AT="hold@after_return", TEST_HOLD_SECONDS="0")
    assert killed.returncode == -9, killed.stderr
    until = RunState.objects.get(pk=held).lease_expires_at
    out = resume("--once")
    from django.utils import timezone

    assert f"nothing due: 1 run leased until {timezone.localtime(until):%H:%M:%S}" in out
    assert "0 run(s) handled" in out
