"""The plan rules, pure: which steps a deploy lacks for a run, whether a run's record fits a new plan, the grace."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest

from durableruns.errors import PlanMismatch
from durableruns.plans import (
    Plan,
    after_lacking,
    attempted_in_order,
    check_fit,
    fingerprint_of,
    lacking,
    lacking_since,
    misfit,
    stopped_reason,
    waiting_reason,
)
from tests.workflows import scripted

R, V, E = "re_executable", "resolvable", "escalate"
A = (("a", R), ("b", V), ("c", E))
PLAN_A = Plan(fingerprint=fingerprint_of(A), workflow="w", steps=A)


def test_the_fingerprint_is_the_one_workflows_have_always_recorded() -> None:
    # sha256 of [[name, policy], ...] as JSON, cut to 16: what runs recorded before plans were
    assert scripted.fingerprint == fingerprint_of([("first", R), ("second", V), ("third", E)]) == (
        hashlib.sha256(b'[["first", "re_executable"], ["second", "resolvable"], ["third", "escalate"]]')
        .hexdigest()[:16])
    assert scripted.as_plan().names == ("first", "second", "third")


@pytest.mark.parametrize(("have", "needed", "expected"), [
    ({"a": R, "b": V, "c": E}, {"a", "b", "c"}, ()),  # the same steps
    ({"a": R, "b": V, "c": E, "d": R}, {"a", "b", "c"}, ()),  # appended: not the run's concern
    ({"a": R, "c": E}, {"b", "c"}, ("b",)),  # removed (or renamed)
    ({"a": R, "c": E}, {"c"}, ()),  # removed, but the run has done it
    ({"a": R, "b": E, "c": E}, {"b", "c"}, ("b",)),  # another policy
    (None, {"b", "c"}, ("b", "c")),  # the whole workflow is missing
    ({}, set(), ()),
])
def test_lacking_names_the_needed_steps_this_deploy_cannot_run(have, needed, expected) -> None:
    assert lacking(PLAN_A, have, needed) == expected


FOUR = (("a", R), ("b", V), ("c", E), ("d", R))


@pytest.mark.parametrize(("attempted", "new", "step"), [
    ((), FOUR, None),
    (("a", "b"), FOUR, None),  # appended after the last attempted step
    (("a", "b", "c"), FOUR, None),
    (("a",), (("a", R), ("x", R), ("b", V), ("c", E)), None),  # inserted after the last attempted step
    (("a", "b"), (("a", R), ("x", R), ("b", V), ("c", E)), "x"),  # inserted before it: would be skipped
    (("a", "b"), (("b", V), ("a", R), ("c", E)), "b"),  # swapped: b was attempted after a, now comes before
    (("a",), (("a", R), ("c", E), ("b", V)), None),  # swapped steps not attempted yet
    (("a", "b"), (("a", R), ("c", E)), "b"),  # an attempted step removed
    (("a", "b"), (("a", R), ("b", E), ("c", E)), "b"),  # an attempted step's policy changed
    (("a",), (("a", R), ("b", E), ("c", E)), None),  # the policy changed of a step not attempted
])
def test_misfit_says_which_step_does_not_fit(attempted, new, step) -> None:
    found = misfit(attempted=attempted, policies=dict(A), new=new)
    assert (found.step if found else None) == step


def test_an_unrecorded_plan_is_checked_for_order_and_gaps_only() -> None:
    assert misfit(attempted=("a", "b"), policies=None, new=(("a", E), ("b", E))) is None
    assert misfit(attempted=("b",), policies=None, new=(("a", R), ("b", V))).step == "a"


def test_check_fit_raises_plan_mismatch_naming_the_step() -> None:
    with pytest.raises(PlanMismatch) as refused:
        check_fit("r1", attempted=("a", "b"), policies=dict(A), new=(("a", R), ("x", R), ("b", V)),
                  new_fingerprint="f2")
    assert refused.value.step == "x" and refused.value.run_id == "r1" and refused.value.plan == "f2"
    assert "run r1 cannot adopt plan f2: x comes before b in the new plan" in str(refused.value)


def test_attempted_in_order_follows_the_plan_else_the_first_starts() -> None:
    t = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [("b", t), ("a", t + timedelta(seconds=5)), ("b", t + timedelta(seconds=9))]
    assert attempted_in_order(PLAN_A, rows) == ["a", "b"]
    assert attempted_in_order(None, rows) == ["b", "a"]


def test_the_waiting_reason_carries_when_the_run_was_first_found_lacking() -> None:
    since = datetime(2026, 12, 1, 22, 0, tzinfo=UTC)
    reason = waiting_reason(fingerprint=PLAN_A.fingerprint, plan=PLAN_A, missing=("b",), since=since)
    assert reason.startswith("waiting for a deploy that has b of the run's plan")
    assert "a (re_executable), b (resolvable), c (escalate)" in reason
    assert lacking_since(reason) == since
    assert lacking_since("lookup raised, asking again later") is None
    stopped = stopped_reason(fingerprint="f", plan=PLAN_A, missing=("b",), grace=timedelta(hours=1))
    assert lacking_since(stopped) is None and "for more than 1 h" in stopped


@pytest.mark.parametrize(("elapsed", "wake"), [
    (0, 60), (100, 160), (3590, 3600), (3600, None), (4000, None),
])
def test_after_lacking_waits_briefly_and_never_past_the_grace(elapsed: int, wake: int | None) -> None:
    since = datetime(2026, 1, 1, tzinfo=UTC)
    found = after_lacking(since=since, now=since + timedelta(seconds=elapsed), grace=timedelta(hours=1),
                          retry=timedelta(seconds=60))
    assert found == (None if wake is None else since + timedelta(seconds=wake))
