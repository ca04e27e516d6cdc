"""Django's own Tasks tests, run against DurableRunsBackend: the contract the backend keeps (issue 30, item 6).

The test cases of Django 6.1.3's tests/tasks that state what any backend owes the Tasks API are vendored in
tests/tasks/django_contract/ (why vendored, and from where: its __init__). Each is subclassed here with TASKS
naming this backend, and run as it is, on Django 6.1 (django.tasks) and on Django 5.2 (the django-tasks backport),
on PostgreSQL and SQLite. A test that cannot apply to this backend is excluded by name with its reason (EXCLUDED_*,
reported as skipped); every other one must pass.

- TaskApi: Django's TaskTestCase (Task, TaskResult, enqueue and get_result), with the default alias on this backend
  instead of the Dummy one, the "immediate" alias kept (the tests use it as a second backend).
- RunsTasks: Django's ImmediateBackendTestCase, what a backend that runs tasks records: status, times, errors,
  tracebacks, return values, context, signals' logs. This backend runs a task in a worker's pass, not in
  enqueue(); ThenWorked (a subclass of it, for these tests only) does one pass right after enqueue() (a real pass:
  claim, intent, the task's call, result, through the record) and returns the result get_result() reads back, so
  the Immediate backend's assertions about a finished task apply to it unchanged.

Not subclassed: ImmediateBackendTransactionTestCase (its one test expects the task to have run inside the caller's
transaction: a worker cannot see a run before its commit; test_backend.py tests the transaction's rule instead),
and Django's test_dummy_backend.py and test_custom_backend.py (those backends' own behaviour).

On Django 6.1 (either database) 44 of the 58 tests collected here apply, and all 44 pass; on Django 5.2 with the
backport, 39 of 39 (five more excluded: Django 6.1 API the backport lacks).
"""

from __future__ import annotations

import unittest
from typing import Any

from django.db import connections
from django.test import TransactionTestCase, override_settings

from durableruns import services
from durableruns.tasks import BACKEND, DurableRunsBackend
from tests.tasks.django_contract import immediate_backend_tests, tasks_api_tests
from tests.tasks.django_contract.compat import DUMMY, IMMEDIATE, PACKAGE


class ThenWorked(DurableRunsBackend):
    """DurableRunsBackend, with one worker pass over the run right after enqueue() (outside a transaction: a pass
    never runs inside one); returns the TaskResult get_result() then reads from the record."""

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        result = super().enqueue(task, args, kwargs)
        if any(connections[alias].in_atomic_block for alias in connections):
            return result
        services.resume_due(run_id=result.id)
        return self.get_result(result.id)


def excluding(reasons: dict[str, str]) -> Any:
    """Skip the named inherited tests, each with its reason, so the run reports them."""

    def decorate(cls: type) -> type:
        for name, reason in reasons.items():
            if not hasattr(cls, name):
                raise AssertionError(f"{cls.__name__}: no test {name} to exclude")
            setattr(cls, name, unittest.skip(reason)(getattr(cls, name)))
        return cls

    return decorate


SYNC_IN_ASYNC = (
    "calls the synchronous get_result()/refresh() from a coroutine; Django refuses a database query "
    "there (SynchronousOnlyOperation), whatever the backend"
)
ONLY_DUMMY = "tests the Dummy backend (its in-memory results list, or that it is the default)"
EXCLUDED_API = {
    "test_using_correct_backend": ONLY_DUMMY,
    "test_enqueue_task": ONLY_DUMMY,
    "test_enqueue_task_async": ONLY_DUMMY,
    "test_get_backend": ONLY_DUMMY,
    "test_module_path": "asserts the path of Django's own test package (tasks.tasks.noop_task); the vendored tasks "
    "live at tests.tasks.django_contract.tasks",
    # Django refuses synchronous database access inside an event loop (SynchronousOnlyOperation), for any backend
    # that keeps results in a database: the sync half of these cannot run there. Their async half (aget_result,
    # arefresh) is what a coroutine calls, and test_get_result_async covers it.
    "test_get_missing_result": SYNC_IN_ASYNC,
    "test_refresh_result": SYNC_IN_ASYNC,
}
if PACKAGE == "django_tasks":  # Django 5.2: what Django 6.1's Task has and the backport (0.12) has not
    EXCLUDED_API |= {
        name: "Django 6.1's Task API, which the django-tasks backport does not have (a test of the API package, "
        "not of a backend)"
        for name in (
            "test_pickle_task",  # Task.__reduce__
            "test_pickle_task_result",
            "test_unpickle_arbitrary_string",  # Task._reconstruct
            "test_unpickle_non_task_object",
            "test_run_after_in_decorator",  # @task(run_after=) refused with Django's message
        )
    }

ONLY_IMMEDIATE = "tests the Immediate backend's own limits, which this backend does not share"
EXCLUDED_RUNS = {
    "test_using_correct_backend": "asserts the Immediate backend is configured, with no options",
    "test_cannot_get_result": ONLY_IMMEDIATE + " (this one reads results back)",
    "test_cannot_refresh_result": ONLY_IMMEDIATE + " (this one refreshes results)",
    "test_cannot_pass_run_after": ONLY_IMMEDIATE + " (this one defers tasks)",
    "test_validate_on_enqueue": "configures the Immediate backend itself inside the test",
    "test_validate_on_aenqueue": "configures the Immediate backend itself inside the test",
    "test_throws_keyboard_interrupt": "the Immediate backend runs a task in the caller's process and lets its "
    "KeyboardInterrupt through; a worker backend records it as the task's failure and goes on (as django-tasks' "
    "database backend does), tested in test_catches_exception's way by test_contract_gaps.py",
}


@excluding(EXCLUDED_API)
@override_settings(
    TASKS={
        "default": {"BACKEND": BACKEND, "QUEUES": ["default", "queue_1"]},
        "immediate": {"BACKEND": IMMEDIATE, "QUEUES": []},
        "missing": {"BACKEND": "does.not.exist"},
    },
    USE_TZ=True,
)
class TaskApi(tasks_api_tests.TaskTestCase, TransactionTestCase):
    databases = "__all__"

    def setUp(self) -> None:  # Django's clears the Dummy backend's results; this backend's are in the record
        pass


@excluding(EXCLUDED_RUNS)
@override_settings(TASKS={"default": {"BACKEND": f"{__name__}.ThenWorked", "QUEUES": []}})
class RunsTasks(immediate_backend_tests.ImmediateBackendTestCase, TransactionTestCase):
    databases = "__all__"


assert DUMMY and PACKAGE  # the names the vendored tests read through compat
