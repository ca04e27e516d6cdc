"""The task workflow ("durableruns.task") is internal: only Task.enqueue starts it, and its step runs only a Task
object of this site's durableruns backend. A run's input names code: every other way in is refused, and a forged
record runs nothing (issue 30, item 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core import checks
from django.test import override_settings

import durableruns
from durableruns import schedules, services, store
from durableruns.errors import DeclarationError, UnknownWorkflow
from durableruns.models import RunState, RunStatus
from durableruns.registry import Workflow, get_workflow, startable_workflows, workflows
from durableruns.tasks import WORKFLOW, TaskResultStatus, tasks, unresolved_task
from tests.tasks import jobs

pytestmark = [pytest.mark.django_db(transaction=True)]

try:
    from django.tasks import task

    IMMEDIATE = "django.tasks.backends.immediate.ImmediateBackend"
except ImportError:
    from django_tasks import task

    IMMEDIATE = "django_tasks.backends.immediate.ImmediateBackend"


def forge(run_id: str, input: dict) -> None:
    """A task run as a crash (or anything writing the record) leaves it: recorded by the store, not the service."""
    plan = tasks.as_plan()
    store.create_run(run_id=run_id, workflow=WORKFLOW, plan_fingerprint=plan.fingerprint, input=input, plan=plan)


def test_start_refuses_the_task_workflow_as_it_refuses_an_unknown_name():
    with pytest.raises(UnknownWorkflow) as refused:
        durableruns.start("durableruns.task", {"task": "subprocess.getoutput", "args": ["id"]})
    with pytest.raises(UnknownWorkflow) as unknown:
        durableruns.start("no.such.workflow", {})
    # The same shape, and the list of what can be started does not name it: nothing says it exists.
    assert str(refused.value).replace("durableruns.task", "X") == str(unknown.value).replace("no.such.workflow", "X")
    assert "durableruns.task" not in str(refused.value).split("known:")[1]
    assert not RunState.objects.exists()


def test_only_the_backend_holding_the_workflow_starts_it():
    assert WORKFLOW in workflows() and get_workflow(WORKFLOW) is tasks  # the engine and the readers find it
    assert WORKFLOW not in startable_workflows()
    impostor = Workflow("tests.impostor-of-internal")
    with pytest.raises(UnknownWorkflow):
        services.start_run(WORKFLOW, {}, internal=impostor)  # another Workflow object is not the key
    assert jobs.add.enqueue(1, 2).status == TaskResultStatus.READY


def test_a_schedule_cannot_start_an_internal_workflow():
    with pytest.raises(DeclarationError, match="internal"):
        durableruns.schedule("tests.every-minute-task", WORKFLOW, "* * * * *", input={"task": "subprocess.getoutput"})
    with pytest.raises(DeclarationError, match="internal"):
        durableruns.schedule("tests.every-minute-task", tasks, "* * * * *")
    assert schedules.get_schedule("tests.every-minute-task") is None


def test_the_schedule_check_does_not_count_an_internal_workflow_as_declared(monkeypatch):
    declared = schedules.Schedule(
        name="tests.sneaked", workflow=WORKFLOW, cron="* * * * *", input={}, timezone="UTC", catch_up="latest"
    )
    monkeypatch.setitem(schedules._declared, "tests.sneaked", declared)  # declared before the workflow was
    errors = [m for m in checks.run_checks() if m.id == "durableruns.E023"]
    assert [e.msg for e in errors] == [f"schedule 'tests.sneaked' names workflow {WORKFLOW!r}, which is not declared"]
    assert schedules.start_due().started == ()
    assert not RunState.objects.filter(workflow=WORKFLOW).exists()


@pytest.mark.parametrize(
    "path",
    ["tests.tasks.jobs.touch", "tests.tasks.jobs.touching_alias", "subprocess.getoutput", "no.such.module.fn", "x"],
)
def test_a_forged_task_run_fails_with_its_reason_and_calls_nothing(tmp_path, monkeypatch, path):
    marker = tmp_path / "called"
    monkeypatch.setattr(jobs, "touching_alias", jobs.add)  # a Task, but declared at another path
    forge("forged", {"task": path, "args": [str(marker)], "kwargs": {}, "backend": "default"})

    services.resume_due()

    run = RunState.objects.get(pk="forged")
    assert run.status == RunStatus.FAILED
    assert "not a task of this site's durableruns backend" in run.reason and repr(path) in run.reason
    assert not marker.exists()
    result = jobs.add.get_backend().get_result("forged")  # read back from the record, nothing imported to call
    assert result.status == TaskResultStatus.FAILED and result.task.func is unresolved_task
    assert result.args == [str(marker)]


def test_a_task_of_another_backend_is_not_run(tmp_path, monkeypatch):
    marker = tmp_path / "called"
    options = {
        "default": {"BACKEND": "durableruns.tasks.DurableRunsBackend", "QUEUES": []},
        "immediate": {"BACKEND": IMMEDIATE, "QUEUES": []},
    }
    with override_settings(TASKS=options):
        monkeypatch.setattr(jobs, "touch", task(backend="immediate")(jobs.touch))
        forge("elsewhere", {"task": "tests.tasks.jobs.touch", "args": [str(marker)], "backend": "default"})
        forge("named-elsewhere", {"task": "tests.tasks.jobs.add", "args": [1, 2], "backend": "immediate"})
        services.resume_due()
    assert RunState.objects.get(pk="elsewhere").status == RunStatus.FAILED
    assert RunState.objects.get(pk="named-elsewhere").status == RunStatus.FAILED
    assert not Path(marker).exists()


spawner = Workflow("tests.spawns-a-task-child")


@spawner.step(policy="re_executable")
def spawn(ctx):
    try:
        ctx.start_run(WORKFLOW, {"task": "subprocess.getoutput", "args": ["id"]}, key="sneak")
    except UnknownWorkflow as exc:
        return {"refused": str(exc)}
    return {"refused": None}


@spawner.step(policy="re_executable")
def spawn_by_object(ctx):
    try:
        ctx.start_run(tasks, {"task": "subprocess.getoutput", "args": ["id"]}, key="sneak-too")
    except UnknownWorkflow as exc:
        return {"refused": str(exc)}
    return {"refused": None}


def test_a_step_cannot_start_a_task_run_as_its_child():
    run_id = services.start_run(spawner.name, {})
    services.resume_due()
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    results = durableruns.result(run_id, timeout=5)
    assert results["spawn"]["refused"].startswith("no workflow named 'durableruns.task' is registered")
    assert results["spawn_by_object"]["refused"].startswith("no workflow named 'durableruns.task' is registered")
    assert not RunState.objects.filter(workflow=WORKFLOW).exists()
