"""The plan drawn on a run's page (durableruns/admin/drawing.py): the SVG above the attempts for runs in each
state (completed, failed, in doubt, running, waiting, a step skipped by when=, with child runs and their join),
its text equivalent, scope, and the docs' drawing of the demo's full purchase order, which must not go stale."""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

import durableruns
from durableruns import drawing, services
from durableruns.admin.display import run_url
from durableruns.models import RunState, RunStatus
from durableruns.registry import get_workflow
from durableruns.waits import Child
from tests.admin.records import completed, escalated, failed
from tests.admin.users import VIEW, logged_in, staff
from tests.factories import complete, crash_after_intent, make_run
from tests.workflows import warehouses

ROOT = Path(__file__).resolve().parents[2]
DOCS_SVG = ROOT / "docs" / "_static" / "plan-purchase-order.svg"
SVG = "{http://www.w3.org/2000/svg}"


def page_of(client, run_id: str) -> str:
    response = client.get(f"/admin/durableruns/runstate/{run_id}/change/")
    assert response.status_code == 200
    return response.content.decode()


def drawn(html: str) -> ET.Element:
    """The run page's SVG, parsed as XML (so a name that broke out of its escaping fails here)."""
    found = re.search(r"<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"dr-plan\".*?</svg>", html, re.S)
    assert found, "the run page holds no drawing"
    return ET.fromstring(found.group(0))


def states(root: ET.Element) -> dict[str, str]:
    return {g.get("data-step"): g.get("data-state") for g in root.iter(f"{SVG}g") if g.get("class") == "dr-plan-step"}


def children(root: ET.Element) -> dict[str, str]:
    return {g.get("data-run"): g.get("data-state") for g in root.iter(f"{SVG}g") if g.get("class") == "dr-plan-child"}


@pytest.mark.django_db(transaction=True)
def test_a_completed_run_is_drawn_done_above_its_attempts_with_a_legend_and_text(as_viewer):
    run_id = completed("drawn-ok")
    html = page_of(as_viewer, run_id)
    assert html.index('id="dr-plan"') < html.index('id="dr-attempts"')
    root = drawn(html)
    assert states(root) == {"first": "done", "second": "done", "third": "done"}
    assert root.find(f"{SVG}title").text == "The plan of run drawn-ok (scripted)"
    legend = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "dr-plan-legend")
    assert {g.get("data-state") for g in legend} == {s.value for s in drawing.State}
    # the text equivalent: the same facts, in order, in words
    text = re.findall(r'<li data-step="([^"]+)" data-state="([^"]+)">', html)
    assert text == [("first", "done"), ("second", "done"), ("third", "done")]
    assert "third (step · escalate): done at" in html


@pytest.mark.django_db(transaction=True)
def test_a_failed_run_is_drawn_failed_at_its_step_and_remaining_after(as_viewer):
    run_id = failed("drawn-failed")
    root = drawn(page_of(as_viewer, run_id))
    assert states(root) == {"first": "failed", "second": "remaining", "third": "remaining"}
    (box,) = [g for g in root.iter(f"{SVG}g") if g.get("data-step") == "first"]
    assert "first refused" in box.find(f"{SVG}title").text  # its error, in its title


@pytest.mark.django_db(transaction=True)
def test_an_in_doubt_run_is_drawn_in_doubt_and_a_live_one_running(as_viewer):
    escalation = escalated("drawn-doubt")
    assert states(drawn(page_of(as_viewer, escalation.run_id))) == {"first": "done", "second": "done",
                                                                   "third": "in_doubt"}
    # the same trace in a live worker's hands (its lease runs an hour more): running, not in doubt
    live = make_run("scripted", run_id="drawn-live")
    complete(live, "first", {"ok": 1})
    crash_after_intent(live, "second", cursor=1)
    RunState.objects.filter(pk=live).update(owner="host:42", lease_expires_at=timezone.now() + timedelta(hours=1))
    html = page_of(as_viewer, live)
    assert states(drawn(html)) == {"first": "done", "second": "running", "third": "remaining"}
    assert "in hand since" in html and "on host:42" in html
    # once its lease has run out, the record alone says: in doubt
    RunState.objects.filter(pk=live).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert states(drawn(page_of(as_viewer, live)))["second"] == "in_doubt"


@pytest.mark.django_db(transaction=True)
def test_a_waiting_run_and_a_step_its_when_skipped(as_viewer):
    durableruns.start("waiting", {"total": 25_000}, run_id="drawn-approval")
    durableruns.start("waiting", {"total": 10}, run_id="drawn-skipped")
    services.resume_due()
    assert states(drawn(page_of(as_viewer, "drawn-approval"))) == {
        "quote": "done", "manager_approval": "waiting", "supplier_confirmed": "remaining", "cool_off": "remaining",
        "notify_buyer": "remaining"}
    html = page_of(as_viewer, "drawn-skipped")
    root = drawn(html)
    assert states(root) == {"quote": "done", "manager_approval": "skipped", "supplier_confirmed": "waiting",
                            "cool_off": "remaining", "notify_buyer": "remaining"}
    kinds = {g.get("data-step"): g.get("data-kind") for g in root.iter(f"{SVG}g") if g.get("data-step")}
    assert kinds == {"quote": "re_executable", "manager_approval": "approval", "supplier_confirmed": "wait_for",
                     "cool_off": "sleep", "notify_buyer": "escalate"}
    assert "manager_approval (approval): skipped by when=, its when= said no" in html


@pytest.mark.django_db(transaction=True)
def test_child_runs_hang_off_their_step_with_their_states_and_the_join_waits_on_them(as_viewer):
    run_id = durableruns.start("shipping", warehouses("north", "south"), run_id="drawn-ship")
    services.resume_due(run_id=run_id)
    assert RunState.objects.get(pk=run_id).status == RunStatus.WAITING
    services.resume_due(run_id=f"{run_id}/book_warehouses/north")
    html = page_of(as_viewer, run_id)
    root = drawn(html)
    assert states(root) == {"book_warehouses": "done", "bookings": "waiting", "ship_order": "remaining"}
    assert children(root) == {f"{run_id}/book_warehouses/north": "done", f"{run_id}/book_warehouses/south": "remaining"}
    links = [a.get("href") for a in root.iter(f"{SVG}a")]
    assert links == [run_url(f"{run_id}/book_warehouses/north"), run_url(f"{run_id}/book_warehouses/south")]
    (join,) = [p for p in root.iter(f"{SVG}path") if p.get("class") == "dr-plan-join"]
    assert "bookings waits for these child runs" in join.find(f"{SVG}title").text
    assert "started 2 child runs (1 done, 1 remaining)" in html


@pytest.mark.django_db(transaction=True)
def test_a_child_run_out_of_the_users_scope_is_not_drawn(settings):
    settings.DURABLERUNS_WORKFLOW_GROUPS = {"booking": ["Carriers"]}
    run_id = durableruns.start("shipping", warehouses("north"), run_id="drawn-scoped")
    services.resume_due(run_id=run_id)
    outsider = logged_in(staff("olga", *VIEW))
    insider = staff("ian", *VIEW)
    insider.groups.add(Group.objects.create(name="Carriers"))
    assert children(drawn(page_of(outsider, run_id))) == {}
    assert 'class="dr-plan-child"' not in page_of(outsider, run_id)
    assert children(drawn(page_of(logged_in(insider), run_id))) == {f"{run_id}/book_warehouses/north": "remaining"}


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_plan_is_not_recorded_is_drawn_from_the_steps_it_attempted(as_viewer):
    run_id = make_run("scripted", run_id="drawn-ghost")
    complete(run_id, "first", {"ok": 1})
    crash_after_intent(run_id, "second", attempt=1, cursor=1)
    RunState.objects.filter(pk=run_id).update(plan_fingerprint="0123456789abcdef")
    root = drawn(page_of(as_viewer, run_id))
    assert states(root) == {"first": "done", "second": "in_doubt"}
    assert {g.get("data-kind") for g in root.iter(f"{SVG}g") if g.get("class") == "dr-plan-step"} == {""}


@pytest.mark.django_db(transaction=True)
def test_a_step_name_from_users_code_is_escaped_on_the_page(as_viewer, monkeypatch):
    evil = "<script>alert(1)</script>&co"
    run_id = completed("drawn-evil")
    steps = get_workflow("scripted").plan_steps
    plan = services.run_plan(RunState.objects.get(pk=run_id))
    monkeypatch.setattr(services, "run_plan", lambda run: type(plan)(
        fingerprint=plan.fingerprint, workflow=plan.workflow, steps=((evil, "escalate"), *steps)))
    html = page_of(as_viewer, run_id)
    assert "<script>alert(1)</script>" not in html
    assert states(drawn(html))[evil] == "remaining"


def purchase_order_drawing() -> str:
    """The demo's full purchase order (project/purchasing/orders.py) mid-way: charged and placed, confirmed by
    the supplier, its approval skipped (below the limit), two of three shipments booked, its join waiting."""
    run_id = "PO-2026-0042"
    workflow = get_workflow("full_purchase_order")
    plan = [name for name, _ in workflow.plan_steps]
    at = {name: drawing.State.DONE for name in plan[: plan.index("book_shipments") + 1]}
    at |= {"manager_approval": drawing.State.SKIPPED, "shipments_booked": drawing.State.WAITING}
    shipments = [Child(run_id=f"{run_id}/book_shipments/{w}", status=s)
                 for w, s in (("Antwerp", "completed"), ("Hamburg", "running"), ("Rotterdam", "pending"))]
    boxes = drawing.boxes(workflow.plan_steps, at, children=drawing.child_boxes(run_id, plan, shipments))
    return drawing.draw(boxes, title=f"The plan of run {run_id} (full_purchase_order)")


def test_the_docs_drawing_of_the_full_purchase_order_is_what_the_code_draws_now():
    svg = purchase_order_drawing()
    if os.environ.get("UPDATE_DOCS_DRAWINGS") == "1":
        DOCS_SVG.parent.mkdir(parents=True, exist_ok=True)
        DOCS_SVG.write_text(svg, encoding="utf-8")
    assert DOCS_SVG.read_text(encoding="utf-8") == svg, (
        "docs/_static/plan-purchase-order.svg is stale: UPDATE_DOCS_DRAWINGS=1 pytest tests/admin/test_drawing.py")
    root = ET.fromstring(svg)
    assert list(states(root)) == [name for name, _ in get_workflow("full_purchase_order").plan_steps]
    assert states(root)["shipments_booked"] == "waiting" and len(children(root)) == 3
