"""The plans runs follow, recorded once under their fingerprints and read back by them."""

from __future__ import annotations

from typing import Any

from django.db import connections, transaction

from durableruns import conf
from durableruns.clock import Clock
from durableruns.distribution import is_distributed
from durableruns.errors import UnknownWorkflow
from durableruns.models import RunPlan
from durableruns.plans import Plan
from durableruns.registry import get_workflow
from durableruns.store.base import DATABASE

# The fingerprints this process knows are recorded (so a start costs one statement, not two), and the plans it
# has read (a recorded plan never changes). Forgotten when the tables are flushed (apps.py, post_migrate).
_recorded: set[str] = set()
_read: dict[str, Plan] = {}


def forget_plans(**kwargs: Any) -> None:
    """Forget which plans are recorded: the tables were emptied (a flush emits post_migrate)."""
    _recorded.clear()
    _read.clear()


def record_plan(plan: Plan, *, clock: Clock = DATABASE) -> None:
    """Record `plan` under its fingerprint unless this process knows it is recorded: INSERT ... ON CONFLICT DO
    NOTHING, so any number of processes may race to record the same plan. Inside a transaction it joins it, and
    the process remembers it only once that commits (a rolled-back start leaves no plan behind)."""
    if plan.fingerprint in _recorded:
        return
    alias = conf.database()
    # On Citus run_plan is a reference table: any write to it, even one that conflicts and writes nothing, is a
    # two-phase commit over every node, so a plan already there is read (on this node) instead.
    if is_distributed(alias) and RunPlan.objects.filter(pk=plan.fingerprint).exists():
        _recorded.add(plan.fingerprint)
        return
    RunPlan.objects.bulk_create(
        [RunPlan(fingerprint=plan.fingerprint, workflow=plan.workflow, steps=[list(s) for s in plan.steps],
                 first_seen=clock.expression())],
        ignore_conflicts=True)
    if connections[alias].in_atomic_block:
        transaction.on_commit(lambda: _recorded.add(plan.fingerprint), using=alias)
    else:
        _recorded.add(plan.fingerprint)


def plan_of(workflow: str, fingerprint: str) -> Plan | None:
    """The plan a run of `workflow` started under (by its recorded fingerprint), or None if it is not recorded.

    This deploy's own plan of the workflow is the same plan when the fingerprints agree (the fingerprint is the
    hash of the steps), so that case costs no query; any other is read once per process."""
    try:
        current = get_workflow(workflow)
    except UnknownWorkflow:
        current = None
    if current is not None and current.fingerprint == fingerprint:
        return current.as_plan()
    plan = _read.get(fingerprint)
    if plan is None:
        row = RunPlan.objects.filter(pk=fingerprint).first()
        if row is None:
            return None
        plan = _read[fingerprint] = row.to_plan()
    return plan
