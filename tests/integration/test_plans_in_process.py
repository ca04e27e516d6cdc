"""Plans in-process: show_run prints the run's own plan; a run stopped for lacking steps is made workable by the
next pass of a deploy that has them; staff can retry it too."""

from __future__ import annotations

import time
from io import StringIO

import pytest
from django.core.management import call_command

from durableruns import registry, services, store
from durableruns.models import RunState, RunStatus, RunStep
from durableruns.plans import STOPPED_MARK, Plan, fingerprint_of
from tests.factories import complete, make_run
from tests.workflows import scripted

pytestmark = pytest.mark.django_db(transaction=True)

OLD_STEPS = (("first", "re_executable"), ("gone", "re_executable"), ("second", "resolvable"))
OLD = Plan(fingerprint=fingerprint_of(OLD_STEPS), workflow="scripted", steps=OLD_STEPS)


def under_old_plan(run_id: str) -> str:
    make_run("scripted", run_id=run_id)
    store.record_plan(OLD)
    RunState.objects.filter(pk=run_id).update(plan_fingerprint=OLD.fingerprint)
    complete(run_id, "first", {})
    return run_id


def test_show_run_prints_the_plan_the_run_started_under():
    run_id = under_old_plan("po-show")
    out = StringIO()
    call_command("show_run", run_id, stdout=out)
    text = out.getvalue()
    assert f"plan {OLD.fingerprint}: first (re_executable), gone (re_executable), second (resolvable)" in text
    assert "gone" in text.split("boundary:")[1] and "third" not in text.split("boundary:")[1]


def test_a_run_stopped_for_a_missing_step_is_worked_again_once_the_deploy_has_it(settings):
    settings.DURABLERUNS_MISSING_STEP_GRACE_SECONDS = 0
    run_id = under_old_plan("po-gone")
    services.resume_due()  # this deploy lacks `gone`; no grace: stopped for staff at once
    stopped = RunState.objects.get(pk=run_id)
    assert stopped.status == RunStatus.NEEDS_DECISION and stopped.reason.startswith(STOPPED_MARK)
    assert "gone of the run's plan" in stopped.reason and RunStep.objects.filter(run_id=run_id).count() == 1
    assert services.reopen_runnable() == 0  # still lacking: left stopped

    # The deploy that has `gone` again: its next pass makes the run workable and finishes it in its own order.
    def gone(ctx: object) -> dict[str, bool]:
        return {"back": True}

    restored = scripted.steps.copy()
    try:
        scripted.step(policy="re_executable")(gone)  # this deploy's plan: first, second, third, gone
        services.resume_due()
        done = RunState.objects.get(pk=run_id)
        assert done.status == RunStatus.COMPLETED, done.reason
        order = RunStep.objects.filter(run_id=run_id).order_by("finished_at").values_list("step", flat=True)
        assert list(order) == ["first", "gone", "second"]
    finally:
        scripted.steps[:] = restored
        scripted._by_name.pop("gone", None)
        scripted.__dict__.pop("_plan", None)
        registry._declared()  # what is derived from the registry (the claims' first steps) is derived anew


def test_staff_may_retry_a_run_stopped_for_a_missing_step(settings):
    settings.DURABLERUNS_MISSING_STEP_GRACE_SECONDS = 0
    run_id = under_old_plan("po-retry")
    services.resume_due()
    assert RunState.objects.get(pk=run_id).status == RunStatus.NEEDS_DECISION
    act = services.retry_run(run_id, by="ops", note="the step is deployed again on the other hosts")
    assert act.action == "retry" and RunState.objects.get(pk=run_id).status == RunStatus.PENDING


def test_a_long_lived_worker_reopens_runs_another_deploy_stopped_after_its_first_look(settings):
    settings.DURABLERUNS_MISSING_STEP_RETRY_SECONDS = 2
    services.resume_due()  # this process (a --loop worker whose deploy has every step) has looked once already
    run_id = make_run("scripted", run_id="po-stopped-elsewhere")
    # Meanwhile a worker of a deploy that lacked `second` stopped the run for staff, as the record shows.
    RunState.objects.filter(pk=run_id).update(
        status=RunStatus.NEEDS_DECISION, reason=f"{STOPPED_MARK}second of the run's plan ..., for more than 0 s")
    services.resume_due()
    assert RunState.objects.get(pk=run_id).status == RunStatus.NEEDS_DECISION  # not looked again at once
    time.sleep(2.1)
    services.resume_due()  # idle past the retry interval: it looks again, reopens the run and finishes it
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, run.reason
