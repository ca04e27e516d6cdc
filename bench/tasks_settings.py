"""The bench site's settings for bench/tasks.py: Django's Tasks on two backends side by side, on one database.

"default" is durableruns' backend (its runs worked by resume_runs); "db" is the Tasks database backend
(django-tasks-db, worked by its db_worker command).
"""

from __future__ import annotations

from bench.settings import *  # noqa: F403
from bench.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks", "django_tasks_db"]
TASKS = {
    "default": {"BACKEND": "durableruns.tasks.DurableRunsBackend", "QUEUES": []},
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": []},
}
DURABLERUNS_WORKFLOW_MODULES = ["bench.workflows"]
