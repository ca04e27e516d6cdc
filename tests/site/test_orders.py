"""The demo site's full purchase order and its nightly reconciliation (project/purchasing/orders.py), driven in
this process by resume passes: what `bin/demo`'s second act shows in worker processes, step by step here."""

from __future__ import annotations

import pytest

import durableruns
from durableruns import services
from durableruns.models import RunState, RunStatus, RunStep

pytestmark = pytest.mark.django_db(transaction=True)


def settle() -> None:
    """Resume passes until nothing is due now (waiting runs stay waiting)."""
    for _ in range(10):
        if not services.resume_due().outcomes:
            return


def test_an_order_below_the_limit_skips_its_approval_waits_for_the_supplier_and_ships_per_warehouse(far):
    run_id = durableruns.start(
        "full_purchase_order",
        {"reference": "PO-7", "buyer": "Quay Bakery", "line_count": 20, "warehouses": ["Hamburg", "Antwerp"]},
    )
    settle()
    assert RunStep.objects.get(run_id=run_id, step="manager_approval").resolution == "skipped"
    assert services.run_boundary(run_id).waiting == {"supplier_confirmed": "wait_for"}
    assert far.payments.count() == 1 and far.portal.count() == 1 and far.carrier.count() == 0

    assert durableruns.send(run_id, "supplier_confirmed", {"backorder": False}, key="m-1")
    settle()
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, services.run_boundary(run_id).sentence()
    children = dict(RunState.objects.filter(parent_id=run_id).values_list("run_id", "status"))
    assert children == {
        f"{run_id}/book_shipments/Antwerp": "completed",
        f"{run_id}/book_shipments/Hamburg": "completed",
    }
    assert sorted(far.carrier.counts_by_key().values()) == [1, 1]
    [email] = far.email.effects()
    assert email["payload"]["subject"] == "PO-7 has shipped"


def test_an_order_above_the_limit_waits_for_a_manager_and_a_rejection_cancels_it_before_any_charge(far):
    run_id = durableruns.start(
        "full_purchase_order", {"reference": "PO-8", "buyer": "Harbour Foods", "line_count": 240}
    )
    settle()
    assert services.run_boundary(run_id).waiting == {"manager_approval": "approval"}
    durableruns.decide(run_id, "manager_approval", "reject", by="manager", note="over budget")
    settle()
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.CANCELLED and "manager" in run.reason and "over budget" in run.reason
    assert far.payments.count() == 0 and far.portal.count() == 0


def test_the_reconciliation_finds_a_charge_no_run_recorded(far):
    run_id = durableruns.start("full_purchase_order", {"reference": "PO-9", "buyer": "Quay Bakery", "line_count": 5})
    settle()
    far.payments.charge(amount=100, currency="EUR", idempotency_key="PO-lost:charge")  # made outside any run
    check = durableruns.start("reconciliation", {})
    settle()
    result = RunStep.objects.get(run_id=check, step="compare_ledgers", status="completed").result
    assert result == {
        "charges": 2,
        "runs_that_charged": 1,
        "not_recorded": ["PO-lost"],
        "not_at_provider": [],
        "orders_in_flight": 1,
    }
    assert RunState.objects.get(pk=run_id).status == RunStatus.WAITING
