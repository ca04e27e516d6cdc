"""Every run status is counted by exactly one side of the metrics' runs gauge: the unfinished ones exactly through
run_state_unfinished_plan_idx, the finished ones by run_count's triggers (migration run_count). A status added to
RunStatus without a side would vanish from the gauge on PostgreSQL."""

from __future__ import annotations

import importlib

from durableruns.models import RunStatus
from durableruns.querysets import RunPlanQuerySet

migration = importlib.import_module("durableruns.migrations.0018_run_count")


def test_each_status_is_counted_by_the_index_or_by_the_triggers_never_both():
    counted = {status.strip(" '") for status in migration.FINISHED.strip("()").split(",")}
    unfinished = set(RunPlanQuerySet.UNFINISHED)
    assert counted == {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}
    assert not counted & unfinished
    assert counted | unfinished == set(RunStatus.values)
