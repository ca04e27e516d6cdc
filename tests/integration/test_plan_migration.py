"""The data migration that records the plans of runs started before plans were recorded."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from durableruns import services
from durableruns.models import RunPlan, RunState, RunStatus
from tests.conftest import CITUS_LANE
from tests.workflows import scripted

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        CITUS_LANE,
        reason="migrates the schema back and forth: a cluster is migrated, then distributed (docs/citus.md)",
    ),
]

BEFORE = [("durableruns", "0006_escalation_alerted_at_run_state_stopped_idx")]  # the one before run_plan


def test_existing_runs_get_their_plan_from_the_current_code_where_it_matches_and_none_is_failed():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        old = executor.loader.project_state(BEFORE).apps.get_model("durableruns", "RunState")
        now = timezone.now()
        for run_id, fingerprint in (("same-plan", scripted.fingerprint), ("lost-plan", "0123456789abcdef")):
            old.objects.create(run_id=run_id, workflow="scripted", plan_fingerprint=fingerprint, status="waiting",
                               input={}, created_at=now, updated_at=now)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes("durableruns"))

    recorded = RunPlan.objects.get()
    assert recorded.fingerprint == scripted.fingerprint and recorded.workflow == "scripted"
    assert recorded.steps == [["first", "re_executable"], ["second", "resolvable"], ["third", "escalate"]]
    assert services.run_boundary("same-plan").plan_known
    lost = services.run_boundary("lost-plan")
    assert not lost.plan_known and str(lost) == "0 steps complete, the rest unknown: the run's plan is not recorded"
    assert set(RunState.objects.values_list("status", flat=True)) == {RunStatus.WAITING}  # nothing failed
