"""The Tasks API the vendored contract tests import: Django 6's `django.tasks`, or on Django 5.2 the django-tasks
backport (`django_tasks`), whose names differ in places (InvalidTaskError for InvalidTask, its logger's name)."""

from __future__ import annotations

try:  # Django 6
    from django.tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResultStatus,
        default_task_backend,
        task,
        task_backends,
    )
    from django.tasks.backends.dummy import DummyBackend
    from django.tasks.backends.immediate import ImmediateBackend
    from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task
    from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist, TaskResultMismatch

    PACKAGE = "django.tasks"
except ImportError:  # Django 5.2 and the backport
    from django_tasks import (  # type: ignore[no-redef,assignment,unused-ignore]
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResultStatus,
        default_task_backend,
        task,
        task_backends,
    )
    from django_tasks.backends.dummy import DummyBackend  # type: ignore[no-redef,assignment,unused-ignore]
    from django_tasks.backends.immediate import ImmediateBackend  # type: ignore[no-redef,assignment,unused-ignore]
    from django_tasks.base import (  # type: ignore[no-redef,assignment,unused-ignore]
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
    )
    from django_tasks.exceptions import (  # type: ignore[no-redef,assignment,unused-ignore]
        InvalidTaskBackendError as InvalidTaskBackend,
    )
    from django_tasks.exceptions import (  # type: ignore[no-redef,assignment,unused-ignore]
        InvalidTaskError as InvalidTask,
    )
    from django_tasks.exceptions import (  # type: ignore[no-redef,assignment,unused-ignore]
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )

    PACKAGE = "django_tasks"

DUMMY = f"{PACKAGE}.backends.dummy.DummyBackend"
IMMEDIATE = f"{PACKAGE}.backends.immediate.ImmediateBackend"
LOGGER = PACKAGE  # the logger its signals' handlers write to

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "DUMMY",
    "IMMEDIATE",
    "LOGGER",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "DummyBackend",
    "ImmediateBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "default_task_backend",
    "task",
    "task_backends",
]
