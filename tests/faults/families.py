"""Parents with children, ended each way, for the crash matrix and the soak (issue 30).

Each family is a `guardian` run of tests.workflows with two `napping_child` runs: the first naps 0 s and books a
counted shipment (the carrier does not deduplicate), so it has completed when its parent ends; the second naps
1 s under a parent that completes or fails (it goes on, and books), an hour under one that ends cancelled (it must
never wake to book). The parent ends, one family each way: it completes; it fails (`refuse_order`); staff reject
its approval (on_reject="cancel"); staff abandon its escalated step; staff cancel it while it waits. The soak (or
the matrix) plays the staff: `end_those_ready` acts on a parent once its first child has completed and the parent
waits where its way of ending is decided.
"""

from __future__ import annotations

from durableruns import services
from durableruns.children import child_run_id
from durableruns.errors import AlreadyDecided, RunNotActionable
from durableruns.models import Escalation, RunState, RunStatus, RunStep
from project.purchasing.far import FarSystems

ENDS = ("complete", "fail", "reject", "abandon", "cancel")
FINAL = {"complete": RunStatus.COMPLETED, "fail": RunStatus.FAILED, "reject": RunStatus.CANCELLED,
         "abandon": RunStatus.CANCELLED, "cancel": RunStatus.CANCELLED}
LONG_NAP = 3600.0
UNSETTLED = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.NEEDS_DECISION)


def parent_id(prefix: str, end: str) -> str:
    return f"{prefix}-family-{end}"


def children(parent: str) -> list[str]:
    return [child_run_id(parent, "start_nappers", n) for n in (0, 1)]


def start(prefix: str) -> dict[str, str]:
    """Start one family per way of ending; return {parent run_id: its end}."""
    import durableruns

    started = {}
    for end in ENDS:
        second = LONG_NAP if FINAL[end] == RunStatus.CANCELLED else 1.0
        run_id = durableruns.start("guardian", {"end": end, "naps": [0, second]}, run_id=parent_id(prefix, end))
        started[run_id] = end
    return started


def runs_of(families: dict[str, str]) -> set[str]:
    """Every run of the families: parents and children."""
    return set(families) | {child for parent in families for child in children(parent)}


def end_those_ready(families: dict[str, str], done: set[str]) -> None:
    """Play the staff: reject, abandon or cancel each parent whose first child has completed and that waits where
    its end is decided; add it to `done` (once acted on, whatever workers do meanwhile)."""
    for parent, end in families.items():
        if parent in done or end not in ("reject", "abandon", "cancel"):
            continue
        first = RunState.objects.filter(pk=children(parent)[0], status=RunStatus.COMPLETED)
        if not first.exists():
            continue
        try:
            if end == "reject" and RunStep.objects.filter(run_id=parent, step="go_ahead", status="started").exists():
                services.decide(parent, "go_ahead", "reject", by="staff", note="over budget")
            elif end == "abandon" and Escalation.objects.open().filter(run_id=parent).exists():
                services.decide(parent, "call_the_supplier", "abandon", by="staff", note="the supplier gave up")
            elif end == "cancel" and RunStep.objects.filter(run_id=parent, step="hold", status="started").exists():
                services.cancel_run(parent, by="staff", note="the buyer withdrew")
            else:
                continue
        except (AlreadyDecided, RunNotActionable):
            continue
        done.add(parent)


def settled(families: dict[str, str]) -> bool:
    return not RunState.objects.filter(pk__in=runs_of(families), status__in=UNSETTLED).exists()


def check(families: dict[str, str], far: FarSystems) -> dict[str, int]:
    """Each parent ended its way; completed children stayed completed; on a parent ended cancelled the unfinished
    child ended cancelled, its reason naming the parent, and never booked; under a parent that completed or failed
    both went on and completed. Every child exists once and booked at most once: nothing made twice."""
    counts = {"families": len(families), "children completed": 0, "children cancelled with their parent": 0}
    bookings = far.carrier.counts_by_key()
    for parent, end in families.items():
        assert RunState.objects.get(pk=parent).status == FINAL[end], (parent, end)
        assert set(RunState.objects.children_of(parent).values_list("run_id", flat=True)) == set(children(parent))
        first, second = (RunState.objects.get(pk=child) for child in children(parent))
        assert first.status == RunStatus.COMPLETED, (first.run_id, first.status, first.reason)
        expected_second = RunStatus.CANCELLED if FINAL[end] == RunStatus.CANCELLED else RunStatus.COMPLETED
        assert second.status == expected_second, (second.run_id, second.status, second.reason)
        if expected_second == RunStatus.CANCELLED:
            assert f"with {parent}" in second.reason, second.reason
            counts["children cancelled with their parent"] += 1
        for child in (first, second):
            booked = bookings.get(f"{child.run_id}:book_after_nap", 0)
            assert booked == (1 if child.status == RunStatus.COMPLETED else 0), (child.run_id, booked)
            completed = RunStep.objects.filter(run_id=child.run_id, step="book_after_nap", status="completed")
            assert completed.count() == (1 if child.status == RunStatus.COMPLETED else 0), child.run_id
            counts["children completed"] += child.status == RunStatus.COMPLETED
    return counts
