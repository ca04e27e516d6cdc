"""ctx.progress and a step's exception, from real `resume_runs` workers on PostgreSQL (issue 33).

Every commit of a step's progress is counted by a trigger on run_step (the workers are other processes): ten
reports in well under a second make two commits, the first and the latest; a worker paused past its lease writes
none; a step that raises has its traceback's last frames recorded with its error and logged at ERROR.
"""

from __future__ import annotations

import signal
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

import tests.progress_workflows  # noqa: F401  (registers the workflows in this process)
from durableruns.models import RunState, RunStatus, RunStep, StepStatus
from tests.conftest import CITUS_LANE, wait_until
from tests.factories import make_run
from tests.progress_workflows import MODULES

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

ENV = {"DURABLERUNS_WORKFLOW_MODULES": MODULES, "DURABLERUNS_RETRY_BACKOFF_SECONDS": "0"}
WORKFLOWS = Path(tests.progress_workflows.__file__)


@pytest.fixture
def commits():
    """The progress commits made to run_step, in order, as (step, attempt, message): a trigger records each."""
    if CITUS_LANE:
        pytest.skip("counts commits with a trigger on run_step, which Citus refuses on a distributed table")
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE test_progress_log (id serial, step text, attempt int, message text)")
        cursor.execute(
            "CREATE FUNCTION test_progress_logged() RETURNS trigger AS $$ BEGIN "
            "INSERT INTO test_progress_log (step, attempt, message) "
            "VALUES (NEW.step, NEW.attempt, NEW.progress_message); RETURN NEW; END $$ LANGUAGE plpgsql"
        )
        cursor.execute(
            "CREATE TRIGGER test_progress_logged AFTER UPDATE OF progress_at ON run_step "
            "FOR EACH ROW EXECUTE FUNCTION test_progress_logged()"
        )

    def read() -> list[tuple[str, int, str]]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT step, attempt, message FROM test_progress_log ORDER BY id")
            return [tuple(row) for row in cursor.fetchall()]

    yield read
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER test_progress_logged ON run_step")
        cursor.execute("DROP FUNCTION test_progress_logged()")
        cursor.execute("DROP TABLE test_progress_log")


def test_ten_reports_in_under_a_second_make_two_commits_and_the_latest_is_kept(workers, commits):
    run_id = make_run("progressing")
    done = workers.run("--worker", "w1", **ENV)
    assert done.returncode == 0, done.stderr
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    count = RunStep.objects.get(run_id=run_id, step="count")
    assert (count.progress_message, count.progress_done, count.progress_total) == ("line 10", 10, 10)
    assert count.started_at <= count.progress_at <= count.finished_at  # the database's clock, before the result
    # the first report at once; the nine within its second held, the latest committed as the step ended
    assert commits() == [("count", 1, "line 1"), ("count", 1, "line 10")]
    quiet = RunStep.objects.get(run_id=run_id, step="quiet")
    assert quiet.progress_at is None and quiet.progress_message is None  # a step that reports nothing
    out = StringIO()
    call_command("show_run", run_id, stdout=out)
    assert "progress of count: line 10 (10/10)" in out.getvalue()


def test_a_worker_that_lost_its_lease_writes_no_progress(workers, tmp_path, commits):
    run_id = make_run("progress_paused")
    mark = tmp_path / "paused"
    paused = workers.start("--lease", "1", "--worker", "paused", TEST_PROGRESS_MARK=str(mark), **ENV)
    wait_until(mark.exists, what="the first attempt to report and reach its pause")
    paused.send_signal(signal.SIGSTOP)
    time.sleep(1.5)  # past its lease; its heartbeat is frozen too
    taker = workers.run("--lease", "30", "--worker", "taker", **ENV)
    assert taker.returncode == 0, taker.stderr
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    paused.send_signal(signal.SIGCONT)
    out, err = paused.communicate(timeout=60)
    assert "fenced_out" in out, out + err  # its report after the pause was refused
    first = RunStep.objects.get(run_id=run_id, step="slow_count", attempt=1)
    assert first.status == StepStatus.STARTED and first.progress_message == "first of attempt 1"
    assert first.progress_done == 1
    second = RunStep.objects.get(run_id=run_id, step="slow_count", attempt=2)
    assert second.progress_message == "first of attempt 2"
    assert ("slow_count", 1, "after the pause") not in commits()
    assert [c for c in commits() if c[1] == 1] == [("slow_count", 1, "first of attempt 1")]


def raising_line() -> int:
    return next(n for n, line in enumerate(WORKFLOWS.read_text().splitlines(), 1) if "RAISES_HERE" in line)


def test_a_failed_step_records_its_traceback_with_the_error_and_the_worker_logs_it_at_error(workers):
    run_id = make_run("progress_breaks")
    # Only ERROR and above reach the worker's log: what it prints below proves the level.
    done = workers.run("--worker", "w1", DURABLERUNS_LOG_LEVEL="ERROR", **ENV)
    assert done.returncode == 0, done.stderr
    assert RunState.objects.get(pk=run_id).status == RunStatus.FAILED
    row = RunStep.objects.get(run_id=run_id, step="breaks")
    assert row.status == StepStatus.FAILED and row.error == "KeyError: 'missing_key'"
    where = f'progress_workflows.py", line {raising_line()}, in lookup_missing'
    assert where in row.error_detail and ", in breaks" in row.error_detail
    assert row.error_detail.rstrip().endswith("KeyError: 'missing_key'") and len(row.error_detail) <= 4100
    assert f"run {run_id}: breaks attempt 1 raised KeyError: 'missing_key'" in done.stderr
    assert "Traceback (most recent call last)" in done.stderr and where in done.stderr
    assert row.progress_message == "about to look it up"  # the report still held when it raised: committed


def test_an_in_doubt_raise_records_its_traceback_with_its_raise(workers):
    run_id = make_run("progress_doubt")
    done = workers.run("--worker", "w1", DURABLERUNS_LOG_LEVEL="ERROR", **ENV)
    assert done.returncode == 0, done.stderr
    assert RunState.objects.get(pk=run_id).status == RunStatus.NEEDS_DECISION
    row = RunStep.objects.get(run_id=run_id, step="unsure")
    assert row.status == StepStatus.STARTED and row.raised_at is not None
    assert ", in unsure" in row.error_detail and "RuntimeError: the far system hung up" in row.error_detail
    assert "RuntimeError: the far system hung up" in done.stderr
