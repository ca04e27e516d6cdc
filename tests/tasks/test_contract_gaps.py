"""Where the backend fell short of the Tasks contract Django's own backends keep (issue 30, item 6): the result
of enqueue() equals get_result()'s, a task that exits or raises KeyboardInterrupt has failed (the worker goes
on), a traceback keeps its last newline, a return value that is not JSON is a TypeError, and a site naming the
backend without the app installed is told so by a system check."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import transaction
from django.test import override_settings

from durableruns import services
from durableruns.models import RunState, RunStatus
from durableruns.tasks import DurableRunsBackend, TaskResultStatus
from tests.tasks import jobs

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_enqueue_s_result_is_get_result_s_with_the_database_s_time_of_the_record():
    result = jobs.add.enqueue(1, 2)
    assert result.enqueued_at is not None
    assert result.enqueued_at == RunState.objects.get(pk=result.id).created_at
    assert jobs.add.get_result(result.id) == result


def test_with_enqueue_on_commit_enqueued_at_is_set_when_the_run_is_recorded():
    options = {
        "default": {
            "BACKEND": "durableruns.tasks.DurableRunsBackend",
            "QUEUES": [],
            "OPTIONS": {"ENQUEUE_ON_COMMIT": True},
        }
    }
    with override_settings(TASKS=options):
        with transaction.atomic():
            result = jobs.add.enqueue(1, 2)
            assert result.enqueued_at is None  # no run yet
        assert result.enqueued_at == RunState.objects.get(pk=result.id).created_at
        assert jobs.add.get_result(result.id) == result


@pytest.mark.parametrize(("job", "kind"), [(jobs.exits, SystemExit), (jobs.interrupts, KeyboardInterrupt)])
def test_a_task_that_exits_or_interrupts_has_failed_and_the_worker_goes_on(job, kind):
    failing = job.enqueue()
    after = jobs.add.enqueue(2, 2)
    services.resume_due()  # one pass: neither exception leaves it
    failed = job.get_result(failing.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in failed.errors] == [kind]
    assert RunState.objects.get(pk=failing.id).status == RunStatus.FAILED
    assert jobs.add.get_result(after.id).return_value == {"total": 4}


def test_a_stored_traceback_ends_with_its_newline():
    result = jobs.explode.enqueue("boom")
    services.resume_due()
    [error] = jobs.explode.get_result(result.id).errors
    assert error.traceback.endswith("ValueError: boom\n")


def test_a_return_value_that_is_not_json_is_a_type_error():
    result = jobs.returns_a_function.enqueue()
    services.resume_due()
    failed = jobs.returns_a_function.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    [error] = failed.errors
    assert error.exception_class is TypeError and "Unsupported type" in error.traceback


def test_the_backend_without_the_app_installed_is_a_check_error(monkeypatch):
    backend = DurableRunsBackend(alias="default", params={"BACKEND": "durableruns.tasks.DurableRunsBackend"})
    assert list(backend.check()) == []
    installed = apps.is_installed
    monkeypatch.setattr(apps, "is_installed", lambda name: name != "durableruns" and installed(name))
    [error] = backend.check()
    assert error.id == "durableruns.E031" and "INSTALLED_APPS" in error.msg
