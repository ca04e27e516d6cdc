"""The recovery boundary as a pure function: tables of histories, then properties over random ones."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durableruns.boundary import StepAttempt, Zone, compute_boundary

PLAN = ("parse_request", "quote", "credit_check", "charge", "book_shipment", "notify_buyer")
T0 = datetime(2026, 8, 8, 14, 7, 12, tzinfo=timezone.utc)


def a(step: str, attempt: int, status: str, minute: int = 0) -> StepAttempt:
    return StepAttempt(step=step, attempt=attempt, status=status, started_at=T0 + timedelta(minutes=minute))


@pytest.mark.parametrize(
    ("attempts", "done", "in_doubt", "failed", "remainder"),
    [
        ([], [], [], [], list(PLAN)),
        ([a("parse_request", 1, "completed")], ["parse_request"], [], [], list(PLAN[1:])),
        # intent with no outcome: in doubt, and still part of the remainder
        ([a("parse_request", 1, "completed"), a("quote", 1, "started")], ["parse_request"], ["quote"], [],
         list(PLAN[1:])),
        # an observed failure is failed, not in doubt
        ([a("parse_request", 1, "failed")], [], [], ["parse_request"], list(PLAN)),
        # the latest attempt decides: failed then started is in doubt; started then completed is done
        ([a("charge", 1, "failed"), a("charge", 2, "started")], [], ["charge"], [], list(PLAN)),
        ([a("charge", 1, "started"), a("charge", 2, "completed")], ["charge"], [], [],
         [s for s in PLAN if s != "charge"]),
        # attempt numbers, not row order, say which is latest
        ([a("charge", 2, "completed"), a("charge", 1, "started")], ["charge"], [], [],
         [s for s in PLAN if s != "charge"]),
        # steps no longer in the plan are ignored
        ([a("legacy_step", 1, "started")], [], [], [], list(PLAN)),
    ],
)
def test_partition_table(attempts, done, in_doubt, failed, remainder):
    b = compute_boundary(PLAN, attempts)
    assert (b.done, b.in_doubt, b.failed, b.remainder) == (done, in_doubt, failed, remainder)


def test_sentence_matches_the_operator_example():
    attempts = [a(s, 1, "completed") for s in PLAN[:3]] + [a("charge", 1, "started")]
    plan = PLAN[:3] + ("x1", "x2", "x3", "charge", "y1", "y2")
    attempts += [a(s, 1, "completed") for s in ("x1", "x2", "x3")]
    assert str(compute_boundary(plan, attempts)) == "6 steps complete, charge in doubt since 14:07, 3 steps remaining"


def test_sentence_singular_and_complete():
    assert str(compute_boundary(("only",), [])) == "0 steps complete, 1 step remaining"
    assert str(compute_boundary(("only",), [a("only", 1, "completed")])) == "all 1 step complete"
    b = compute_boundary(("only",), [a("only", 3, "failed")])
    assert str(b) == "0 steps complete, only failed (attempt 3), 1 step remaining"


def test_every_zone_is_reachable_and_named():
    b = compute_boundary(("d", "i", "f", "n"), [a("d", 1, "completed"), a("i", 1, "started"), a("f", 1, "failed")])
    assert [b.zone(s) for s in b.plan] == [Zone.DONE, Zone.IN_DOUBT, Zone.FAILED, Zone.NOT_STARTED]


statuses = st.sampled_from(["started", "completed", "failed"])
histories = st.lists(
    st.tuples(st.sampled_from(PLAN + ("gone",)), st.integers(min_value=1, max_value=6), statuses),
    max_size=30,
    unique_by=lambda t: (t[0], t[1]),  # (step, attempt) is the primary key
)


def _attempts(history):
    return [a(step, n, status) for step, n, status in history]


@given(histories)
def test_zones_partition_the_plan(history):
    b = compute_boundary(PLAN, _attempts(history))
    zones = [set(b.done), set(b.in_doubt), set(b.failed)]
    assert all(not (x & y) for i, x in enumerate(zones) for y in zones[i + 1:])
    assert set(b.done) | set(b.remainder) == set(PLAN)
    assert not set(b.done) & set(b.remainder)
    assert set(b.in_doubt) | set(b.failed) <= set(b.remainder)
    for field in (b.done, b.in_doubt, b.failed, b.remainder):
        assert field == [s for s in PLAN if s in field]  # plan order


@given(histories)
def test_latest_attempt_decides(history):
    b = compute_boundary(PLAN, _attempts(history))
    for step in PLAN:
        mine = [(n, status) for s, n, status in history if s == step]
        if not mine:
            assert b.zone(step) is Zone.NOT_STARTED
            continue
        _, status = max(mine)
        expected = {"completed": Zone.DONE, "started": Zone.IN_DOUBT, "failed": Zone.FAILED}[status]
        assert b.zone(step) is expected


@given(histories, st.randoms())
def test_row_order_does_not_matter(history, rnd):
    attempts = _attempts(history)
    shuffled = attempts[:]
    rnd.shuffle(shuffled)
    one, two = compute_boundary(PLAN, attempts), compute_boundary(PLAN, shuffled)
    assert (one.done, one.in_doubt, one.failed, one.remainder) == (two.done, two.in_doubt, two.failed,
                                                                   two.remainder)


@given(histories)
def test_an_in_doubt_step_is_never_reported_failed_or_done(history):
    attempts = _attempts(history)
    b = compute_boundary(PLAN, attempts)
    for step in b.in_doubt:
        assert b.latest[step].status == "started"
        assert step not in b.failed and step not in b.done
