"""Results held for a later commit (issue 34, durableruns.held): steps declared intent=False share one commit.

tests.workflows.chained: reserve (resolvable, with an intent), price_1..3 (re_executable, intent=False), confirm
(resolvable). Each call appends "<step> <rows>" to a file: how many of the run's attempts were committed when it
was called. Worked in-process against the real database; the crash matrix kills real workers at these points.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

import durableruns
from durableruns import services
from durableruns.models import RunState, RunStatus, RunStep
from tests.conftest import CITUS_LANE

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def settings_for_chains(settings):
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0
    settings.DURABLERUNS_HOLD_RESULTS_SECONDS = 30  # a loaded machine never ends a chain early


def start(tmp_path: Path, workflow: str = "chained", **extra: object) -> tuple[str, Path]:
    calls = tmp_path / "calls"
    run_id = durableruns.start(workflow, {"calls": str(calls), "ledger": str(tmp_path / "ledger"), **extra})
    return run_id, calls


def seen(calls: Path) -> list[str]:
    return calls.read_text().splitlines()


def commits(run_id: str) -> list[list[str]] | None:
    """The run's completed attempts grouped by the transaction that wrote them (xmin), in commit order. None on
    SQLite and on a Citus cluster (no transaction id to read through the coordinator): `seen` tells there what each
    step found committed when it acted, and the crash matrix the rest."""
    if connection.vendor != "postgresql" or CITUS_LANE:
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT step, xmin::text::bigint FROM run_step WHERE run_id = %s AND status = 'completed'"
                       " ORDER BY xmin::text::bigint, step", [run_id])
        groups: dict[int, list[str]] = {}
        for step, xid in cursor.fetchall():
            groups.setdefault(xid, []).append(step)
    return list(groups.values())


def test_a_chain_of_steps_without_intents_is_one_commit_made_before_the_next_intent_step_acts(tmp_path):
    run_id, calls = start(tmp_path)
    services.resume_due()
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    # While the chain ran nothing of it was committed; confirm acted after its own intent and the chain's results.
    assert seen(calls) == ["reserve 1", "price_1 1", "price_2 1", "price_3 1", "confirm 5"]
    assert commits(run_id) in ([["reserve"], ["price_1", "price_2", "price_3"], ["confirm"]], None)
    if commits(run_id) is not None:  # confirm's intent and the chain: one statement, one now()
        started = RunStep.objects.get(run_id=run_id, step="confirm").started_at
        assert started == RunStep.objects.get(run_id=run_id, step="price_3").finished_at
    results = dict(RunStep.objects.filter(run_id=run_id).values_list("step", "result"))
    assert [results[f"price_{n}"]["total"] for n in (1, 2, 3)] == [1, 3, 6]  # each saw the held result before it


def test_with_the_window_at_zero_each_result_is_committed_alone(tmp_path, settings):
    settings.DURABLERUNS_HOLD_RESULTS_SECONDS = 0
    run_id, calls = start(tmp_path)
    services.resume_due()
    assert seen(calls) == ["reserve 1", "price_1 1", "price_2 2", "price_3 3", "confirm 5"]
    assert commits(run_id) in ([["reserve"], ["price_1"], ["price_2"], ["price_3"], ["confirm"]], None)


def test_a_chain_older_than_the_window_is_committed_and_a_new_one_begins(tmp_path, settings):
    settings.DURABLERUNS_HOLD_RESULTS_SECONDS = 0.2
    run_id, calls = start(tmp_path, sleep={"price_2": 0.3})
    services.resume_due()
    assert seen(calls) == ["reserve 1", "price_1 1", "price_2 1", "price_3 3", "confirm 5"]
    assert commits(run_id) in ([["reserve"], ["price_1", "price_2"], ["price_3"], ["confirm"]], None)


def test_a_chain_that_ends_the_run_ends_it_in_its_one_commit(tmp_path):
    run_id, calls = start(tmp_path, workflow="pure_chain")
    services.resume_due()
    assert seen(calls) == ["price_1 0", "price_2 0", "price_3 0"]
    assert commits(run_id) in ([["price_1", "price_2", "price_3"]], None)
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED and run.cursor == 3


def test_a_step_that_raises_in_a_chain_commits_the_held_results_before_its_failure(tmp_path):
    run_id, calls = start(tmp_path, raise_in="price_3")
    services.resume_due()
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    assert seen(calls) == ["reserve 1", "price_1 1", "price_2 1", "price_3 1", "price_3 4", "confirm 6"]
    rows = {(s, a): (st, at) for s, a, st, at in RunStep.objects.filter(run_id=run_id)
            .values_list("step", "attempt", "status", "finished_at")}
    assert rows[("price_3", 1)][0] == "failed" and rows[("price_3", 2)][0] == "completed"
    assert rows[("price_1", 1)][1] < rows[("price_3", 1)][1]  # committed first, not lost with the failure
    assert commits(run_id) in ([["reserve"], ["price_1", "price_2"], ["price_3"], ["confirm"]], None)


def test_a_worker_that_lost_the_run_in_a_chain_writes_none_of_it(tmp_path):
    run_id, calls = start(tmp_path, take_over_in="price_2")
    report = services.resume_due()
    assert [o.status for o in report.outcomes] == ["fenced_out"]
    assert seen(calls) == ["reserve 1", "price_1 1", "price_2 1", "price_3 1"]
    assert list(RunStep.objects.filter(run_id=run_id).values_list("step", flat=True)) == ["reserve"]
    assert RunState.objects.get(pk=run_id).cursor == 1


def test_a_step_that_sets_attributes_commits_them_with_the_chain_so_far(tmp_path):
    run_id, calls = start(tmp_path, attribute_in="price_2")
    services.resume_due()
    assert seen(calls) == ["reserve 1", "price_1 1", "price_2 1", "price_3 3", "confirm 5"]
    assert commits(run_id) in ([["reserve"], ["price_1", "price_2"], ["price_3"], ["confirm"]], None)
    assert durableruns.boundary(run_id).attributes == {"priced_by": "price_2"}


def test_a_step_without_an_intent_that_checkpoints_fails_saying_why_instead_of_looping(tmp_path):
    run_id = durableruns.start("unrecorded_loop", {})
    report = services.resume_due()
    assert [o.status for o in report.outcomes] == [RunStatus.FAILED]  # not fenced out, again and again
    run = RunState.objects.get(pk=run_id)
    assert "count_lines is declared intent=False" in run.reason and "ctx.loop" in run.reason, run.reason
    assert list(RunStep.objects.filter(run_id=run_id).values_list("attempt", "status")) == [(1, "failed"),
                                                                                          (2, "failed")]


def test_held_results_of_every_json_shape_are_recorded_as_returned_a_null_as_json_null():
    run_id = durableruns.start("held_values", {})
    services.resume_due()
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    results = dict(RunStep.objects.filter(run_id=run_id).values_list("step", "result"))
    assert results == {"gives_null": None, "gives_text": 'a "quoted" \\ path\u2028é',
                       "gives_object": {"n": [1, 2.5, None], "nested": {"null": None, "s": "x'y"}}}
    if connection.vendor == "postgresql":  # the null is JSON's, as a step's returned None always is, not SQL's
        with connection.cursor() as cursor:
            cursor.execute("SELECT jsonb_typeof(result) FROM run_step WHERE run_id = %s AND step = 'gives_null'",
                           [run_id])
            assert cursor.fetchone() == ("null",)
