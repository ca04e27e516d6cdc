"""The runs gauge and the finished counter stay exact however runs move: started, completed, failed, cancelled by
staff, retried, pruned, finished by two worker processes at once; and the migration's seed counts what was there
before its triggers, whatever the triggers counted meanwhile. The gauge is checked against a count of run_state
itself, the counter against the finishes each test made."""

from __future__ import annotations

import importlib
import re

import pytest
from django.db import connection
from django.db.models import Count
from prometheus_client.parser import text_string_to_metric_families

from durableruns import services
from durableruns.models import RunState
from durableruns.ops.metrics import render_record
from durableruns.ops.prune import prune
from tests.conftest import CITUS_LANE
from tests.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)

seed = importlib.import_module("durableruns.migrations.0018_run_count")


def scraped() -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """(durableruns_runs, durableruns_runs_finished_total) by (workflow, status), as the view serves them."""
    runs, finished = {}, {}
    for family in text_string_to_metric_families(render_record().decode()):
        for sample in family.samples:
            key = (sample.labels.get("workflow", ""), sample.labels.get("status", ""))
            if sample.name == "durableruns_runs":
                runs[key] = sample.value
            elif sample.name == "durableruns_runs_finished_total":
                finished[key] = sample.value
    return runs, finished


def assert_exact(finished: dict[str, int]) -> None:
    """The gauge equals a count of run_state; the counter equals `finished` (status -> times, workflow scripted).
    On a Citus-distributed record, which has no counting triggers (docs/citus.md), the counter is the finished
    runs present: the gauge's finished statuses."""
    runs, counted = scraped()
    rows = RunState.objects.order_by().values_list("workflow", "status").annotate(n=Count("pk"))
    assert runs == {(workflow, status): n for workflow, status, n in rows}
    if CITUS_LANE:
        finished = {status: n for (_, status), n in runs.items() if status in ("completed", "failed", "cancelled")}
    assert counted == {("scripted", status): n for status, n in finished.items()}


def drain() -> None:
    for _ in range(10):
        if not services.resume_due().outcomes:
            return
    raise AssertionError("runs still due after 10 passes")


def test_counts_stay_exact_as_runs_finish_fail_are_cancelled_retried_and_pruned(settings):
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0
    settings.DURABLERUNS_PRUNE_EVIDENCE_DAYS = 0
    for _ in range(3):
        make_run("scripted")
    failing = [make_run("scripted", {"first": "reject"}) for _ in range(2)]
    assert_exact({})
    drain()
    assert_exact({"completed": 3, "failed": 2})

    services.cancel_run(make_run("scripted"), by="ops", note="a duplicate order")
    services.cancel_run(failing[1], by="ops", note="gave up")  # failed -> cancelled: out of one, into the other
    make_run("scripted")
    assert_exact({"completed": 3, "failed": 2, "cancelled": 2})
    services.retry_run(failing[0], by="ops", note="the provider is back")  # failed -> pending
    assert RunState.objects.filter(status="failed").count() == 0
    assert_exact({"completed": 3, "failed": 2, "cancelled": 2})
    drain()  # the retried run fails again, the new one completes
    assert_exact({"completed": 4, "failed": 3, "cancelled": 2})

    make_run("scripted")  # unfinished: the prune leaves it
    report = prune(older_than_days=0)
    assert report.runs == 7
    assert_exact({"completed": 4, "failed": 3, "cancelled": 2})  # the gauge loses them; the counter does not


@pytest.mark.postgres
def test_two_worker_processes_finishing_at_once_leave_exact_counts(workers):
    # Each first step takes 0.25 s: 48 runs are 3 s of work for one process's 4 threads, so the other process,
    # started with it, is up and claiming long before one could drain them all alone (it once did, on a quiet
    # machine, and the test saw one process finish nothing).
    for _ in range(40):
        make_run("scripted", {"first": "sleep", "sleep": 0.25})
    for _ in range(8):
        make_run("scripted", {"first": "sleep", "sleep": 0.25, "second": "reject"})
    procs = [workers.start("--once", "--concurrency", "4", DURABLERUNS_RETRY_BACKOFF_SECONDS="0") for _ in range(2)]
    finished_by = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out[-2000:] + err[-2000:]
        finished_by.append(sum(int(n) for n in re.findall(r"(\d+) (?:completed|failed)\b", out.splitlines()[-1])))
    assert sum(finished_by) == 48 and min(finished_by) > 0, finished_by  # both processes finished runs
    assert_exact({"completed": 40, "failed": 8})


@pytest.mark.postgres
@pytest.mark.skipif(CITUS_LANE, reason="a Citus-distributed record has no run_count triggers to seed after")
def test_the_seed_counts_the_runs_from_before_the_triggers_once():
    def with_triggers(enabled: bool) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE run_state {'ENABLE' if enabled else 'DISABLE'} TRIGGER USER")

    with_triggers(False)  # what a populated record looks like to the migration
    try:
        before = [make_run("scripted") for _ in range(5)]
        RunState.objects.filter(pk__in=before[:4]).update(status="completed")
        RunState.objects.filter(pk=before[4]).update(status="failed")
    finally:
        with_triggers(True)
    # Between the triggers' commit and the seed's snapshot: changes the triggers count.
    RunState.objects.filter(pk=before[0]).delete()
    RunState.objects.filter(pk=before[4]).update(status="cancelled")
    RunState.objects.filter(pk=make_run("scripted")).update(status="completed")
    with connection.cursor() as cursor:
        cursor.execute(seed.POSTGRES_SEED)
    # Present before the triggers: 4 completed, 1 failed; entered since: 1 completed, 1 cancelled.
    assert_exact({"completed": 5, "failed": 1, "cancelled": 1})
