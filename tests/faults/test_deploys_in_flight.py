"""Deploys while runs are in flight: each run follows the plan it started under, whatever code a worker runs.

Two declarations of one workflow (`parcel`, tests/faults/plan_deploys.py) are loaded by separate worker
processes, as a rolling deploy has them: the test process declares the plan it starts runs under, each worker
its own deploy's. The ledger counts every effect by its key, across processes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

import durableruns
from durableruns import registry, services
from durableruns.errors import PlanMismatch
from durableruns.models import Intervention, RunPlan, RunState, RunStatus, RunStep
from tests.conftest import Workers, wait_until
from tests.faults import plan_deploys
from tests.faults.plan_deploys import VERSIONS, declare
from tests.logs import stray_tracebacks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

V1 = [name for name, _ in VERSIONS["v1"]]


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The effects ledger, shared with the workers; `parcel` leaves the test process's registry afterwards."""
    folder = tmp_path / "ledger"
    monkeypatch.setenv("PARCEL_LEDGER", str(folder))
    saved = dict(registry._registry)
    yield folder
    registry._registry.clear()
    registry._registry.update(saved)
    registry._declared()


def deploy(version: str, **extra: str) -> dict[str, str]:
    env = {"DURABLERUNS_WORKFLOW_MODULES": "tests.faults.plan_deploys", "PARCEL_DEPLOY": version,
           "DURABLERUNS_RETRY_BACKOFF_SECONDS": "0", "DURABLERUNS_LOOKUP_RETRY_SECONDS": "0.3"}
    env.update(extra)
    return env


def resume(workers: Workers, env: dict[str, str], *args: str) -> str:
    """One resume_runs pass of `env`'s deploy; it must exit 0 without a traceback. Returns what it printed."""
    proc = workers.start("--lease", "1", *args, **env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and not stray_tracebacks(err), out + err
    return out


def crash(workers: Workers, run_id: str, at: str, env: dict[str, str]) -> None:
    """A worker of `env`'s deploy works `run_id` and is SIGKILLed at `at`; its lease then runs out."""
    proc = workers.start("--run", run_id, "--lease", "0.5", **env, DURABLERUNS_CRASH_AT=at)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -9, out + err
    time.sleep(0.6)


def completed_in_order(run_id: str) -> list[str]:
    rows = RunStep.objects.filter(run_id=run_id, status="completed").order_by("finished_at", "step")
    return list(rows.values_list("step", flat=True))


def attempted(run_id: str) -> set[str]:
    return set(RunStep.objects.filter(run_id=run_id).values_list("step", flat=True))


def acted(run_id: str, step: str) -> list[str]:
    return plan_deploys.effects(f"{run_id}:{step}")


def run(run_id: str) -> RunState:
    return RunState.objects.get(pk=run_id)


@pytest.mark.parametrize("version", ["append", "swap", "insert"])
def test_a_deploy_changes_the_plan_of_new_runs_only(ledger: Path, workers: Workers, version: str) -> None:
    declare("v1")
    old = durableruns.start("parcel", {}, run_id=f"old-{version}")
    crash(workers, old, "label@after_intent", deploy("v1"))  # pack done, label in doubt, under v1
    assert attempted(old) == {"pack", "label"} and acted(old, "label") == []

    new_plan = declare(version)  # the deploy: new runs start under the new plan
    new = durableruns.start("parcel", {}, run_id=f"new-{version}")
    assert run(old).plan_fingerprint != run(new).plan_fingerprint == new_plan.fingerprint
    assert durableruns.boundary(old).plan == tuple(V1)  # read through its own plan, not this deploy's

    out = resume(workers, deploy(version))
    assert f"{old}: completed" in out and f"{new}: completed" in out, out
    # The old run finished plan v1, in v1's order: nothing skipped, nothing added.
    assert completed_in_order(old) == V1 and attempted(old) == set(V1)
    assert RunStep.objects.filter(run_id=old, step="label").count() == 2  # the in-doubt attempt, then a new one
    # The new run followed the new plan.
    assert completed_in_order(new) == [name for name, _ in VERSIONS[version]]
    # Each effect once: the old run's pack by v1, the rest by the new deploy.
    assert [acted(old, step) for step in V1] == [["v1"], [version], [version]]
    assert all(acted(new, name) == [version] for name, _ in VERSIONS[version])


def test_a_removed_step_makes_the_run_wait_the_check_names_it_and_restoring_it_finishes_the_run(
    ledger: Path, workers: Workers
) -> None:
    declare("v1")
    run_id = durableruns.start("parcel", {}, run_id="parcel-removed")
    crash(workers, run_id, "label@after_intent", deploy("v1"))  # pack done; label in doubt, it never acted
    assert attempted(run_id) == {"pack", "label"}

    # The deploy that removes `label`: its worker leaves the run for one that has it, without an attempt.
    removed = deploy("remove", DURABLERUNS_MISSING_STEP_GRACE_SECONDS="1", DURABLERUNS_MISSING_STEP_RETRY_SECONDS="0.2")
    preview = resume(workers, removed, "--dry-run")
    assert "would leave it for a deploy that has label" in preview, preview
    out = resume(workers, removed)
    assert f"{run_id}: waiting - waiting for a deploy that has label of the run's plan" in out, out
    waiting = run(run_id)
    assert waiting.status == RunStatus.WAITING and "pack (re_executable), label (resolvable)" in waiting.reason
    assert RunStep.objects.filter(run_id=run_id).count() == 2 and acted(run_id, "ship") == []

    # Before the old code is gone, the deploy pipeline's check names the step and the runs that still need it.
    declare("remove")
    errors = StringIO()
    call_command("check", "--database", "default", stdout=StringIO(), stderr=errors)
    fingerprint = waiting.plan_fingerprint
    assert (f"parcel.label (resolvable) is missing from this deploy: 1 active run(s) of plan {fingerprint} "
            f"still need it") in errors.getvalue(), errors.getvalue()
    assert "parcel.pack" not in errors.getvalue()  # this deploy has it, with the same policy

    # Past the grace period (the database's clock, from when it was first found lacking): stopped for staff.
    wake_at = waiting.wake_at
    assert wake_at is not None
    wait_until(lambda: wake_at <= timezone.now(), what="the run's next look")
    time.sleep(1)
    out = resume(workers, removed)
    stopped = run(run_id)
    assert stopped.status == RunStatus.NEEDS_DECISION, out
    assert "this deploy lacks label of the run's plan" in stopped.reason and fingerprint in stopped.reason
    assert RunStep.objects.filter(run_id=run_id).count() == 2

    # The deploy that has `label` again: its next pass makes the run workable and finishes it, each step once.
    out = resume(workers, deploy("v1"))
    assert f"{run_id}: completed" in out, out
    assert completed_in_order(run_id) == V1
    assert [acted(run_id, step) for step in V1] == [["v1"], ["v1"], ["v1"]]
    assert RunStep.objects.filter(run_id=run_id, step="label").count() == 2  # found absent by key, run once


def test_a_step_declared_with_another_policy_is_a_step_this_deploy_lacks(ledger: Path, workers: Workers) -> None:
    declare("v1")
    run_id = durableruns.start("parcel", {}, run_id="parcel-repolicy")
    crash(workers, run_id, "label@after_intent", deploy("v1"))  # label in doubt, recorded as resolvable
    out = resume(workers, deploy("repolicy"))
    assert f"{run_id}: waiting - waiting for a deploy that has label" in out, out
    assert Intervention.objects.count() == 0 and RunStep.objects.filter(run_id=run_id, step="label").count() == 1
    assert resume(workers, deploy("v1"), "--run", run_id).count("completed") >= 1
    assert completed_in_order(run_id) == V1 and acted(run_id, "label") == ["v1"]


def test_an_old_deploy_worker_leaves_a_new_plan_run_untouched_and_a_new_deploy_worker_finishes_it(
    ledger: Path, workers: Workers
) -> None:
    declare("append")  # the new deploy starts the run; a worker still on v1 claims it first
    run_id = durableruns.start("parcel", {}, run_id="parcel-rolling")
    out = resume(workers, deploy("v1", DURABLERUNS_MISSING_STEP_RETRY_SECONDS="0.3"))
    assert f"{run_id}: waiting - waiting for a deploy that has notify" in out, out
    left = run(run_id)
    assert left.status == RunStatus.WAITING and RunStep.objects.filter(run_id=run_id).count() == 0
    assert all(acted(run_id, step) == [] for step in V1)

    wake_at = left.wake_at
    assert wake_at is not None
    wait_until(lambda: wake_at <= timezone.now(), what="the run's next look")
    out = resume(workers, deploy("append"))
    assert f"{run_id}: completed" in out, out
    assert completed_in_order(run_id) == ["pack", "label", "ship", "notify"]
    assert list(RunStep.objects.filter(run_id=run_id).values_list("attempt", flat=True)) == [1, 1, 1, 1]
    assert all(acted(run_id, step) == ["append"] for step in ("pack", "label", "ship", "notify"))


def test_adopt_plan_where_the_record_fits_runs_the_appended_step(ledger: Path, workers: Workers) -> None:
    declare("v1")
    run_id = durableruns.start("parcel", {}, run_id="parcel-adopt")
    crash(workers, run_id, "ship@before_intent", deploy("v1"))  # pack and label done under v1
    old = run(run_id).plan_fingerprint

    appended = declare("append")
    act = durableruns.adopt_plan(run_id, by="ops", note="the buyer must hear of it")
    assert act.action == Intervention.Action.ADOPT_PLAN and act.decided_by == "ops"
    assert act.result["from_plan"] == old and act.result["to_plan"] == appended.fingerprint
    assert act.result["to_steps"][-1] == ["notify", "re_executable"]
    adopted = run(run_id)
    assert adopted.plan_fingerprint == appended.fingerprint and adopted.status == RunStatus.PENDING
    assert RunPlan.objects.filter(pk=appended.fingerprint).exists()

    out = resume(workers, deploy("append"))
    assert f"{run_id}: completed" in out, out
    assert completed_in_order(run_id) == ["pack", "label", "ship", "notify"]
    assert acted(run_id, "pack") == ["v1"] and acted(run_id, "notify") == ["append"]


@pytest.mark.parametrize(("version", "step", "why"), [
    ("insert", "weigh", "weigh comes before label in the new plan, and was never attempted"),
    ("swap", "ship", "ship comes before label in the new plan, and was never attempted"),
    ("remove", "label", "label was attempted, and the new plan has no label"),
    ("repolicy", "label", "label was attempted as resolvable, and the new plan declares it escalate"),
])
def test_adopt_plan_where_the_record_does_not_fit_is_refused_and_the_run_untouched(
    ledger: Path, workers: Workers, version: str, step: str, why: str
) -> None:
    declare("v1")
    run_id = durableruns.start("parcel", {}, run_id=f"parcel-misfit-{version}")
    crash(workers, run_id, "ship@before_intent", deploy("v1"))
    before = RunState.objects.filter(pk=run_id).values().get()

    declare(version)
    with pytest.raises(PlanMismatch) as refused:
        services.adopt_plan(run_id, by="ops", note="try the new plan")
    assert refused.value.step == step and why in str(refused.value), str(refused.value)
    assert RunState.objects.filter(pk=run_id).values().get() == before  # untouched
    assert Intervention.objects.count() == 0

    # It still finishes its own plan, with a deploy that has it.
    out = resume(workers, deploy("v1"), "--run", run_id)
    assert f"{run_id}: completed" in out, out
    assert completed_in_order(run_id) == V1
