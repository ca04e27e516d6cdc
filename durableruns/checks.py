"""System checks: declarations that would fail a resume are reported at start-up, not on the day of a crash."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from durableruns.policies import Policy
from durableruns.registry import workflows


@checks.register()
def check_workflows(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every workflow has steps; every resolvable step has a lookup (Workflow.step enforces policy itself)."""
    messages: list[checks.CheckMessage] = []
    for name, workflow in workflows().items():
        if not workflow.steps:
            messages.append(checks.Error(f"workflow {name!r} declares no steps", id="durableruns.E001"))
        for step in workflow.steps:
            if step.policy is Policy.RESOLVABLE and step.lookup is None:
                messages.append(checks.Error(f"{name}.{step.name} is resolvable but has no lookup",
                                             id="durableruns.E002"))
            if step.policy is Policy.ESCALATE and not step.doc:
                messages.append(checks.Warning(
                    f"{name}.{step.name} escalates but has no docstring",
                    hint="Staff read the docstring in the escalation queue: say how to check the far system by hand.",
                    id="durableruns.W002"))
    return messages


@checks.register(checks.Tags.database)
def check_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """SQLite has no row locks: fine for trying the app with one worker, not for several hosts."""
    if not kwargs.get("databases"):
        return []
    engine = settings.DATABASES.get("default", {}).get("ENGINE", "")
    if engine.endswith("sqlite3"):
        return [checks.Warning(
            "durableruns is running on SQLite",
            hint="SQLite serialises writers and has no SKIP LOCKED: use PostgreSQL before running resume_runs "
                 "from several workers or hosts.",
            id="durableruns.W001")]
    return []
