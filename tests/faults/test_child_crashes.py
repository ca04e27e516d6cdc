"""Child runs under SIGKILL: a real worker killed around ctx.start_run (before any child, between two children,
after the last one with the step's result, which records them, not committed) and around the join's completion,
then resumed by other workers (staff settle a child's confirmation that was in flight in a killed worker's
other thread).

Every child exists once, under its derived run_id; each join completes once; the carrier books once per child
(its ledger does not deduplicate, so a doubled child or booking shows).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import durableruns
from durableruns.children import child_run_id
from durableruns.models import Escalation, RunState, RunStatus, RunStep
from project.purchasing.far import FarSystems
from tests.conftest import Workers
from tests.workflows import warehouses

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.slow]

POINTS = (
    ("book_warehouses", "after_intent"),  # the step about to start its children: none exists
    ("book_warehouses", "started:1"),  # one child asked for (a re_executable step's: recorded with its result)
    ("book_warehouses", "after_return"),  # every child asked for, the step's result (and they) not committed
    ("bookings", "before_complete"),  # every child ended, the join's completion not committed
    ("bookings", "after_complete"),  # the join completed, the next step not begun
)
NAMES = ("north", "south", "east")


def test_a_worker_killed_around_start_run_and_the_join_starts_each_child_once_and_joins_once(
    far: FarSystems, workers: Workers, tmp_path: Path
) -> None:
    parents = [durableruns.start("shipping", warehouses(*NAMES), run_id=f"child-crash-{n}") for n in range(4)]
    for step, point in POINTS:
        # One worker per point draining what is due; it dies the first time any run reaches the point.
        crashed = workers.run("--once", "--lease", "1", "--worker", f"doomed-{point}", timeout=60,
                              DURABLERUNS_CRASH_AT=f"{step}@{point}",
                              DURABLERUNS_CRASH_MARKER=str(tmp_path / f"{step}-{point}"))
        assert crashed.returncode == -9, f"{step}@{point}: not killed (exit {crashed.returncode}):\n{crashed.stderr}"
        time.sleep(1.1)  # its lease runs out

    deadline = time.monotonic() + 60
    while RunState.objects.filter(pk__in=parents).exclude(status=RunStatus.COMPLETED).exists():
        assert time.monotonic() < deadline, (
            list(RunState.objects.filter(pk__in=parents).values_list("run_id", "status", "wake_at", "reason")),
            list(RunStep.objects.filter(run_id__in=parents).values_list("run_id", "step", "attempt", "status")))
        result = workers.run("--once", "--lease", "1", timeout=60)
        assert result.returncode == 0, result.stderr
        # A child's confirmation in flight in a killed worker's other thread is in doubt, and escalates: it holds
        # its parent's join until staff decide it (it acts on nothing, so running it again is right).
        for escalation in Escalation.objects.open():
            durableruns.decide(escalation.run_id, escalation.step, "did_not_happen", by="ops", note="ask again")
        time.sleep(0.5)

    for parent in parents:
        expected = {child_run_id(parent, "book_warehouses", n) for n in NAMES}
        assert set(RunState.objects.children_of(parent).values_list("run_id", flat=True)) == expected, parent
        joins = list(RunStep.objects.filter(run_id=parent, step="bookings", status="completed"))
        assert len(joins) == 1 and set(joins[0].result) == expected, parent
        assert all(child["status"] == "completed" for child in joins[0].result.values()), parent
        assert RunStep.objects.filter(run_id=parent, step="ship_order", status="completed").count() == 1
    children = RunState.objects.filter(parent_id__in=parents)
    assert children.count() == 3 * len(parents) and set(children.values_list("status", flat=True)) == {"completed"}
    assert far.carrier.count() == 3 * len(parents) and not far.carrier.duplicates()
