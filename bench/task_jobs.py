"""The task bench/tasks.py enqueues on both backends: it does nothing, so what is measured is the backend."""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def noop() -> None:
    return None
