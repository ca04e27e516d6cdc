"""Run attributes in-process on the real database (PostgreSQL, and SQLite: none of this needs row locks):
asked of the input once at start by every way in, set by a step with its result, in the same commit or not at
all, read back by boundary(run_id), deleted with the run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import durableruns
from durableruns import schedules, services, store
from durableruns.clock import Clock
from durableruns.errors import DeclarationError, FencedOut, InvalidInput
from durableruns.models import RunAttribute, RunState, RunStatus, RunStep
from durableruns.ops import prune
from durableruns.registry import Workflow
from tests.attribute_workflows import order_input

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_backoff(settings):
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0


def attrs(run_id: str) -> dict[str, tuple[str, str]]:
    rows = RunAttribute.objects.filter(run_id=run_id).values_list("name", "value_text", "kind")
    return {name: (text, kind) for name, text, kind in rows}


def test_declared_attributes_are_recorded_at_start_and_read_by_boundary() -> None:
    run_id = durableruns.start("attributed_order", order_input(), run_id="po-41")
    assert attrs(run_id) == {"po": ("PO-2026-0041", "s"), "buyer": ("Acme BV", "s"), "lines": ("3", "i")}
    assert durableruns.boundary(run_id).attributes == {"buyer": "Acme BV", "lines": 3, "po": "PO-2026-0041"}


def test_set_attributes_is_committed_with_the_result_later_steps_replace() -> None:
    run_id = durableruns.start("attributed_order", order_input(), run_id="po-set")
    services.resume_due()
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    got = durableruns.boundary(run_id).attributes
    assert got["invoice"] == "INV-1" and got["carrier"] == "DHL"
    assert got["amount"] == 99  # ship replaced invoice's 120
    assert got["po"] == "PO-2026-0041"


def test_a_step_that_raises_after_set_attributes_records_none_of_them() -> None:
    run_id = durableruns.start("attributed_order", order_input(mode="raise_once"), run_id="po-raise-once")
    services.resume_due()
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    assert durableruns.boundary(run_id).attributes["invoice"] == "INV-2"  # attempt 1's INV-1 was never recorded

    failed = durableruns.start("attributed_order", order_input(mode="raise_after_set"), run_id="po-raise")
    services.resume_due()
    assert RunState.objects.get(pk=failed).status == RunStatus.FAILED
    assert set(attrs(failed)) == {"po", "buyer", "lines"}  # neither attempt's invoice nor amount


def test_a_bad_value_in_set_attributes_is_the_steps_error() -> None:
    run_id = durableruns.start("attributed_order", order_input(mode="bad_value"), run_id="po-bad")
    services.resume_due()
    assert RunState.objects.get(pk=run_id).status == RunStatus.FAILED
    errors = list(RunStep.objects.filter(run_id=run_id, step="invoice").values_list("error", flat=True))
    assert len(errors) == 2 and all("InvalidInput" in e and "'invoice'" in e for e in errors)
    assert "invoice" not in attrs(run_id)


@pytest.mark.parametrize(
    ("input", "named"),
    [
        ({"buyer": {"name": "Acme"}}, "'po'"),  # a missing input key
        ({"po_number": "PO-1", "buyer": "Acme"}, "'buyer'"),  # the function raises
        ({"po_number": "x" * 201, "buyer": {"name": "Acme"}}, "'po'"),  # too long
        ({"po_number": 4.5, "buyer": {"name": "Acme"}}, "'po'"),  # neither str nor int
        ({"po_number": True, "buyer": {"name": "Acme"}}, "'po'"),  # a bool is not an int
        ({"po_number": "PO-1", "buyer": {"name": ["Acme"]}}, "'buyer'"),
    ],
)
def test_a_bad_value_at_start_is_invalid_input_naming_it_and_nothing_is_recorded(input, named) -> None:
    with pytest.raises(InvalidInput, match=named) as raised:
        durableruns.start("attributed_order", input, run_id="po-refused")
    assert raised.value.attribute == named.strip("'")
    assert not RunState.objects.filter(pk="po-refused").exists()
    assert not RunAttribute.objects.exists()


@pytest.mark.parametrize(
    "attributes",
    [
        {"not an identifier": "po"},
        {"x" * 51: "po"},
        {"po": 3},
        {"po": None},
        ["po"],
    ],
)
def test_a_bad_declaration_is_refused_at_import(attributes) -> None:
    with pytest.raises(DeclarationError):
        Workflow("attributed_badly", attributes=attributes)


def test_a_fenced_out_worker_writes_no_attributes() -> None:
    run_id = durableruns.start("attributed_order", order_input(), run_id="po-fenced")
    lease = store.Lease(run_id=run_id, owner="stale", epoch=RunState.objects.get(pk=run_id).epoch + 7, seconds=30)
    with pytest.raises(FencedOut):
        store.record_result(
            lease,
            step="invoice",
            attempt=1,
            result={},
            cursor=1,
            intent_recorded=False,
            attributes={"invoice": "INV-stale"},
        )
    assert "invoice" not in attrs(run_id)


def test_child_runs_record_their_own_attributes_both_ways() -> None:
    run_id = durableruns.start("attributed_order", order_input(children=2, resolvable_child=True), run_id="po-kids")
    services.resume_due()
    kids = sorted(RunState.objects.children_of(run_id).values_list("run_id", flat=True))
    assert len(kids) == 3
    assert {attrs(k)["po"][0] for k in kids} == {"PO-2026-0041-0", "PO-2026-0041-1", "PO-2026-0041-r"}
    assert all(attrs(k)["buyer"] == ("Acme BV", "s") for k in kids)


def test_a_schedules_runs_record_their_attributes_and_a_refused_input_starts_none(monkeypatch) -> None:
    monkeypatch.setattr(schedules, "_declared", {})
    durableruns.schedule("po_sync", "attributed_order", "* * * * *", input=order_input(po="PO-SCHED"))
    base = datetime(2026, 6, 1, 9, 0, 10, tzinfo=UTC)
    at = Clock(shift=base - Clock().now())
    schedules.start_due(clock=at)
    (started,) = schedules.start_due(clock=Clock(shift=base + timedelta(seconds=60) - Clock().now())).started
    assert attrs(started)["po"] == ("PO-SCHED", "s")

    durableruns.schedule("po_broken", "attributed_order", "* * * * *", input={"buyer": {"name": "Acme"}})
    assert "'po'" in schedules.input_refused(schedules.get_schedule("po_broken"))


def test_attributes_go_with_their_run_when_it_is_deleted_or_pruned() -> None:
    gone = durableruns.start("attributed_order", order_input(po="PO-GONE"), run_id="po-gone")
    RunState.objects.filter(pk=gone).delete()  # the cascade
    assert not RunAttribute.objects.filter(run_id=gone).exists()

    pruned = durableruns.start("attributed_order", order_input(po="PO-PRUNED"), run_id="po-pruned")
    kept = durableruns.start("attributed_order", order_input(po="PO-KEPT"), run_id="po-kept")
    RunState.objects.filter(pk=pruned).update(
        status=RunStatus.COMPLETED, updated_at=Clock().now() - timedelta(days=400)
    )
    report = prune.prune(older_than_days=30)
    assert report.runs == 1 and report.attributes == 3
    assert not RunAttribute.objects.filter(run_id=pruned).exists()
    assert attrs(kept)["po"] == ("PO-KEPT", "s")
