"""The plan drawn (durableruns.drawing), pure: each state's look, the states read from the boundary, the order
of the boxes, escaping of names from users' code, child runs hanging off their step, a join waiting on them."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from durableruns import drawing
from durableruns.boundary import StepAttempt, compute_boundary
from durableruns.drawing import LOOKS, State
from durableruns.waits import Child

SVG = "{http://www.w3.org/2000/svg}"
T0 = datetime(2026, 8, 8, 14, 7, tzinfo=timezone.utc)
PLAN = (("parse_request", "re_executable"), ("manager_approval", "approval"), ("charge", "resolvable"),
        ("book_shipments", "re_executable"), ("shipments_booked", "join"), ("notify_buyer", "escalate"))
NAMES = tuple(name for name, _ in PLAN)
EVIL = 'charge <script>alert("x")</script> & co'


def a(step: str, attempt: int, status: str) -> StepAttempt:
    return StepAttempt(step=step, attempt=attempt, status=status, started_at=T0 + timedelta(minutes=attempt))


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # well-formed XML, or this raises


def steps_of(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if g.get("class") == "dr-plan-step"]


def test_every_state_has_a_look_of_its_own_colour_and_symbol():
    assert set(LOOKS) == set(State)
    assert len({look.stroke for look in LOOKS.values()}) == len(State)
    assert len({look.symbol for look in LOOKS.values()}) == len(State)  # colour is not the only signal
    assert len({look.label for look in LOOKS.values()}) == len(State)
    assert set(drawing.CHILD_STATES.values()) <= set(State)


@pytest.mark.parametrize(
    ("attempts", "skipped", "live", "status", "expected"),
    [
        ([], (), False, "pending", ["remaining"] * 6),
        ([a("parse_request", 1, "completed")], (), False, "pending", ["done"] + ["remaining"] * 5),
        ([a("parse_request", 1, "completed"), a("manager_approval", 1, "completed")], {"manager_approval"}, False,
         "pending", ["done", "skipped"] + ["remaining"] * 4),
        ([a("parse_request", 1, "completed"), a("manager_approval", 1, "started")], (), False, "waiting",
         ["done", "waiting"] + ["remaining"] * 4),
        # a run cancelled while it waited waits no more
        ([a("parse_request", 1, "completed"), a("manager_approval", 1, "started")], (), False, "cancelled",
         ["done", "remaining"] + ["remaining"] * 4),
        ([a("parse_request", 1, "completed"), a("manager_approval", 1, "completed"), a("charge", 1, "started")],
         (), False, "needs_decision", ["done", "done", "in_doubt"] + ["remaining"] * 3),
        # the same record in a live worker's hands: the step is running, not in doubt
        ([a("parse_request", 1, "completed"), a("manager_approval", 1, "completed"), a("charge", 1, "started")],
         (), True, "running", ["done", "done", "running"] + ["remaining"] * 3),
        ([a("parse_request", 1, "failed"), a("parse_request", 2, "failed")], (), False, "failed",
         ["failed"] + ["remaining"] * 5),
    ],
)
def test_each_steps_state_comes_from_the_boundary_and_the_facts_beside_it(attempts, skipped, live, status, expected):
    b = replace(compute_boundary(NAMES, attempts, waits={"manager_approval": "approval", "shipments_booked": "join"}),
                status=status)
    states = drawing.step_states(b, skipped=skipped, live=live)
    assert list(states) == list(NAMES)
    assert [s.value for s in states.values()] == expected


def test_a_step_waiting_for_its_turn_under_a_rate_limit_is_waiting():
    b = replace(compute_boundary(NAMES, [a("parse_request", 1, "completed")],
                                 turns={"manager_approval": ("k", T0)}), status="waiting")
    assert drawing.step_states(b)["manager_approval"] is State.WAITING


def test_the_boxes_are_drawn_in_plan_order_each_with_its_state_symbol_and_title():
    states = {"parse_request": State.DONE, "manager_approval": State.SKIPPED, "charge": State.IN_DOUBT}
    root = parse(drawing.draw(drawing.boxes(PLAN, states), title="The plan of run po-1"))
    boxes = steps_of(root)
    assert [g.get("data-step") for g in boxes] == list(NAMES)
    assert [g.get("data-state") for g in boxes] == ["done", "skipped", "in_doubt", "remaining", "remaining",
                                                   "remaining"]
    for g, state in zip(boxes, ["done", "skipped", "in_doubt"], strict=False):
        look = LOOKS[State(state)]
        assert look.symbol in "".join(g.itertext())
        assert g.find(f"{SVG}rect").get("stroke") == look.stroke
        assert g.find(f"{SVG}title").text.startswith(g.get("data-step"))
    hatched = [r for r in boxes[2].iter(f"{SVG}rect") if r.get("fill") == "url(#dr-hatch)"]
    assert hatched  # in doubt has its pattern
    assert boxes[1].find(f"{SVG}rect").get("stroke-dasharray")  # skipped, a dashed border
    assert root.get("role") == "img" and root.find(f"{SVG}title").text == "The plan of run po-1"
    assert "charge (step \u00b7 resolvable): in doubt" in root.find(f"{SVG}desc").text
    arrows = [line for line in root.iter(f"{SVG}line") if line.get("marker-end") == "url(#dr-arrow)"]
    assert len(arrows) == len(PLAN) - 1


def test_the_legend_names_every_state_with_its_symbol():
    root = parse(drawing.draw((), title="empty"))
    legend = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "dr-plan-legend")
    items = {g.get("data-state"): "".join(g.itertext()) for g in legend.findall(f"{SVG}g")}
    assert set(items) == {s.value for s in State}
    for state, text in items.items():
        assert LOOKS[State(state)].label in text and LOOKS[State(state)].symbol in text


def test_names_from_users_code_are_escaped_and_long_ones_cut_whole_in_the_title():
    long = "reserve_stock_at_every_warehouse_of_the_region_" + "x" * 40
    steps = ((EVIL, "resolvable"), (long, "re_executable"))
    child = Child(run_id=f"po<&>/{EVIL}/k<&>", status="running")
    kids = drawing.child_boxes("po<&>", [EVIL, long], [child], {child.run_id: "/admin/?a=1&b=<2>"})
    svg = drawing.draw(drawing.boxes(steps, {EVIL: State.FAILED}, details={EVIL: 'said "<no>"'}, children=kids),
                       title=f"run {EVIL}")
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "&amp; co" in svg
    root = parse(svg)
    first, second = steps_of(root)
    assert first.get("data-step") == EVIL  # whole, once parsed
    assert EVIL in first.find(f"{SVG}title").text and 'said "<no>"' in first.find(f"{SVG}title").text
    shown = [t.text for t in second.iter(f"{SVG}text")]
    assert long not in shown and any(t and t.endswith("\u2026") and long.startswith(t[:-1]) for t in shown)
    assert second.find(f"{SVG}title").text.startswith(long)
    (link,) = root.iter(f"{SVG}a")
    assert link.get("href") == "/admin/?a=1&b=<2>"
    assert "\x00" not in drawing.draw(drawing.boxes((("bad\x00name", "x"),), {}), title="t\x07")


def test_child_runs_hang_off_the_step_that_started_them_and_a_join_waits_on_them():
    children = [Child(run_id="po-1/book_shipments/Antwerp", status="completed"),
                Child(run_id="po-1/book_shipments/Hamburg", status="running"),
                Child(run_id="po-1/book/Rotterdam", status="failed"),  # a step of another name: not this plan's
                Child(run_id="po-2/book_shipments/Rotterdam", status="waiting")]  # another run's
    kids = drawing.child_boxes("po-1", NAMES, children)
    assert list(kids) == ["book_shipments"]
    assert [(c.label, c.state) for c in kids["book_shipments"]] == [("Antwerp", State.DONE),
                                                                    ("Hamburg", State.RUNNING)]
    states = {name: State.DONE for name in NAMES[:4]} | {"shipments_booked": State.WAITING}
    plan = drawing.boxes(PLAN, states, children=kids)
    root = parse(drawing.draw(plan, title="t"))
    drawn = [g for g in root.iter(f"{SVG}g") if g.get("class") == "dr-plan-child"]
    assert [(g.get("data-run"), g.get("data-state")) for g in drawn] == [
        ("po-1/book_shipments/Antwerp", "done"), ("po-1/book_shipments/Hamburg", "running")]
    (join,) = [p for p in root.iter(f"{SVG}path") if p.get("class") == "dr-plan-join"]
    assert join.find(f"{SVG}title").text == "shipments_booked waits for these child runs"
    assert join.get("d").count("M") == 3  # one line from each child, and one on to the join
    said = drawing.describe(plan[3])
    assert said.endswith("started 2 child runs (1 done, 1 running)")


def test_a_step_with_many_children_draws_a_few_and_counts_the_rest():
    children = [Child(run_id=f"p/fan/{n:02d}", status="pending") for n in range(20)]
    kids = drawing.child_boxes("p", ["fan"], children)
    root = parse(drawing.draw(drawing.boxes((("fan", "re_executable"),), {}, children=kids), title="t"))
    drawn = [g for g in root.iter(f"{SVG}g") if g.get("class") == "dr-plan-child"]
    assert len(drawn) == drawing.CHILDREN_DRAWN
    (more,) = [g for g in root.iter(f"{SVG}g") if g.get("class") == "dr-plan-more"]
    assert "and 14 more child runs" in "".join(more.itertext())


def test_the_longest_step_name_a_child_run_id_fits_wins():
    kids = drawing.child_boxes("p", ["a", "a/b"], [Child(run_id="p/a/b/k", status="completed")])
    assert {step: [c.label for c in found] for step, found in kids.items()} == {"a/b": ["k"]}


def test_a_detail_that_says_its_state_is_not_said_twice():
    done = drawing.StepBox(name="quote", kind="re_executable", state=State.DONE, detail="done at 14:07 (attempt 1)")
    assert drawing.describe(done) == "quote (step \u00b7 re_executable): done at 14:07 (attempt 1)"
    skipped = replace(done, state=State.SKIPPED, detail="its when= said no")
    assert drawing.describe(skipped) == "quote (step \u00b7 re_executable): skipped by when=, its when= said no"


def test_the_drawing_is_the_same_for_the_same_facts():
    plan = drawing.boxes(PLAN, {"charge": State.FAILED})
    assert drawing.draw(plan, title="t") == drawing.draw(plan, title="t")
