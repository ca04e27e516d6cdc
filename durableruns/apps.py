"""durableruns' AppConfig: registers the system checks, sets the connection timeouts and SQLite's set-up,
and imports each installed app's workflows.py."""

from __future__ import annotations

from importlib import import_module

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import register
from django.db.backends.signals import connection_created
from django.db.models.signals import post_migrate


class DurableRunsConfig(AppConfig):
    name = "durableruns"
    verbose_name = "Durable runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from durableruns import (
            checks,  # registers the checks
            connections,
            discovery,
            faults,
            sqlite,
        )

        connections.apply_timeouts()  # before any connection is opened: a cut-off worker must not hang
        faults.arm_from_environment()
        connection_created.connect(sqlite.tune_connection, dispatch_uid="durableruns.sqlite.tune_connection")
        register(sqlite.check_sqlite_options, checks.TAG)
        # A flush empties the tables and emits post_migrate: the plans this process knew recorded are gone.
        post_migrate.connect(_forget_plans, dispatch_uid="durableruns.store.forget_plans")

        # Each app's workflows.py, then what lives outside an installed app (a script's, a test suite's), named in
        # settings; a DeclarationError is recorded for system check E030, not raised (durableruns.discovery).
        discovery.discover()
        # A site whose TASKS use durableruns: its workers need the workflow that task runs follow.
        if any(
            params.get("BACKEND") == "durableruns.tasks.DurableRunsBackend"
            for params in getattr(settings, "TASKS", {}).values()
        ):
            import_module("durableruns.tasks")


def _forget_plans(**kwargs: object) -> None:
    from durableruns import store

    store.forget_plans()
