"""The holdings rules as pure functions: which acquisitions a run holds, which it may hold, in what order a run
that ends unfinished gives them back, and what each shows."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from durableruns import Workflow
from durableruns.boundary import StepAttempt, compute_boundary
from durableruns.errors import DeclarationError
from durableruns.holdings import (
    Acquisition,
    HoldState,
    acquisition_round,
    assess,
    given_back,
    held,
    lapse_phrase,
    needs_releasing,
    release_order,
    release_round,
    release_step,
    round_key,
    soonest_lapse,
)
from durableruns.policies import Policy

T0 = datetime(2026, 8, 8, 14, 0, tzinfo=timezone.utc)
PLAN = ("lock", "reserve", "charge", "ship")
ACQ = (
    Acquisition(step="lock", release_step="lock:release"),
    Acquisition(
        step="reserve",
        release_step="reserve:release",
        hold_expires_after=timedelta(hours=4),
        released_by="ship",
        has_lookup=True,
    ),
)


def a(step: str, status: str, minute: int, attempt: int = 1, result: object = None) -> StepAttempt:
    return StepAttempt(
        step=step,
        attempt=attempt,
        status=status,
        started_at=T0 + timedelta(minutes=minute),
        finished_at=T0 + timedelta(minutes=minute) if status != "started" else None,
        result=result,
    )


def states(attempts: list[StepAttempt]) -> dict[str, HoldState]:
    return {h.step: h.state for h in assess(PLAN, ACQ, attempts)}


@pytest.mark.parametrize(
    ("attempts", "expected"),
    [
        ([], {"lock": HoldState.NOT_ACQUIRED, "reserve": HoldState.NOT_ACQUIRED}),
        ([a("lock", "completed", 1)], {"lock": HoldState.HELD, "reserve": HoldState.NOT_ACQUIRED}),
        (
            [a("lock", "completed", 1), a("reserve", "started", 2)],
            {"lock": HoldState.HELD, "reserve": HoldState.POSSIBLY_HELD},
        ),
        (
            [a("lock", "completed", 1), a("reserve", "failed", 2)],
            {"lock": HoldState.HELD, "reserve": HoldState.NOT_ACQUIRED},
        ),
        # a completed release gives it back; a failed or in-doubt one does not
        (
            [a("lock", "completed", 1), a("lock:release", "completed", 5)],
            {"lock": HoldState.RELEASED, "reserve": HoldState.NOT_ACQUIRED},
        ),
        (
            [a("lock", "completed", 1), a("lock:release", "failed", 5)],
            {"lock": HoldState.HELD, "reserve": HoldState.NOT_ACQUIRED},
        ),
        (
            [a("lock", "completed", 1), a("lock:release", "started", 5)],
            {"lock": HoldState.HELD, "reserve": HoldState.NOT_ACQUIRED},
        ),
        # released_by a later step that completed: handed on, not held
        (
            [
                a("lock", "completed", 1),
                a("reserve", "completed", 2),
                a("charge", "completed", 3),
                a("ship", "completed", 4),
            ],
            {"lock": HoldState.KEPT, "reserve": HoldState.HANDED_ON},
        ),
        (
            [a("lock", "completed", 1), a("reserve", "completed", 2), a("ship", "started", 4)],
            {"lock": HoldState.HELD, "reserve": HoldState.HELD},
        ),
    ],
)
def test_each_acquisition_state_follows_from_the_record(
    attempts: list[StepAttempt], expected: dict[str, HoldState]
) -> None:
    assert states(attempts) == expected


def test_a_completed_run_holds_nothing() -> None:
    done = [a(step, "completed", i) for i, step in enumerate(PLAN)]
    assert held(assess(PLAN, ACQ, done)) == []
    assert not needs_releasing(assess(PLAN, ACQ, done))


def test_releases_go_in_reverse_order_of_completion_and_in_doubt_lookups_first() -> None:
    # reserve completed before lock here (a retried lock), so reserve is released last
    attempts = [a("reserve", "completed", 1), a("lock", "failed", 0), a("lock", "completed", 3, attempt=2)]
    assert [h.step for h in release_order(assess(PLAN, ACQ, attempts))] == ["lock", "reserve"]
    attempts = [a("lock", "completed", 1), a("reserve", "completed", 2)]
    assert [h.step for h in release_order(assess(PLAN, ACQ, attempts))] == ["reserve", "lock"]
    in_doubt = [a("lock", "completed", 1), a("reserve", "started", 2)]
    assert [h.step for h in release_order(assess(PLAN, ACQ, in_doubt))] == ["reserve", "lock"]


def test_an_acquisition_in_doubt_without_a_lookup_is_listed_not_released() -> None:
    holdings = assess(PLAN, ACQ, [a("lock", "started", 1)])
    assert [h.step for h in held(holdings)] == ["lock"]
    assert release_order(holdings) == []
    assert not needs_releasing(holdings)
    assert "possibly held" in held(holdings)[0].sentence(T0) and "staff" in held(holdings)[0].sentence(T0)


def test_a_holding_shows_its_result_since_and_expiry() -> None:
    holding = assess(
        PLAN, ACQ, [a("lock", "completed", 1), a("reserve", "completed", 2, result={"reservation_id": "rs_1"})]
    )[1]
    assert holding.result == {"reservation_id": "rs_1"}
    assert holding.since == T0 + timedelta(minutes=2)
    assert holding.expires_at == T0 + timedelta(hours=4, minutes=2)
    now = T0 + timedelta(hours=3, minutes=22)
    assert holding.sentence(now) == "reserve held since 14:02, lapses in 40 min"
    assert soonest_lapse(assess(PLAN, ACQ, [a("reserve", "completed", 2)])) == holding.expires_at


@pytest.mark.parametrize(
    ("left", "phrase"),
    [
        (timedelta(minutes=40, seconds=30), "lapses in 40 min"),
        (timedelta(hours=2, minutes=5), "lapses in 2 h 5 min"),
        (timedelta(minutes=-5), "lapsed 5 min ago"),
    ],
)
def test_the_lapse_is_said_in_an_operators_words(left: timedelta, phrase: str) -> None:
    assert lapse_phrase(left) == phrase


def test_a_release_is_declared_as_a_step_of_its_own() -> None:
    wf = Workflow("holdings-unit")

    def give_back(ctx: object) -> None:
        return None

    def find(ctx: object) -> None:
        return None

    @wf.step(policy="re_executable", release=give_back, hold_expires_after=timedelta(hours=1), released_by="b")
    def a_(ctx: object) -> None:
        return None

    @wf.step(policy="re_executable", release=give_back, release_lookup=find)
    def b(ctx: object) -> None:
        return None

    assert wf["a_"].releaser is not None and wf["a_"].releaser.name == release_step("a_") == "a_:release"
    assert wf["a_"].releaser.policy is Policy.RE_EXECUTABLE
    assert wf["b"].releaser is not None and wf["b"].releaser.policy is Policy.RESOLVABLE
    assert [x.step for x in wf.acquisitions()] == ["a_", "b"]
    assert wf.acquisitions()[0].hold_expires_after == timedelta(hours=1)
    assert wf.releaser("b:release") is wf["b"].releaser
    with pytest.raises(DeclarationError, match="release="):
        wf.step(policy="re_executable", hold_expires_after=timedelta(hours=1))
    with pytest.raises(DeclarationError, match="comes before"):

        @wf.step(policy="re_executable", release=give_back, released_by="a_")
        def c(ctx: object) -> None:
            return None


def test_a_released_by_naming_no_later_step_is_a_system_check_error() -> None:
    from durableruns import registry
    from durableruns.checks import check_workflows

    wf = Workflow("holdings-unit-bad")

    def give_back(ctx: object) -> None:
        return None

    @wf.step(policy="re_executable", release=give_back, released_by="nowhere")
    def grab(ctx: object) -> None:
        return None

    try:
        errors = [m for m in check_workflows() if m.id == "durableruns.E004"]
        assert [m.msg for m in errors] == [
            "holdings-unit-bad.grab is released_by 'nowhere', which is not a later step of the plan"
        ]
    finally:
        registry._registry.pop("holdings-unit-bad")
    assert not [m for m in check_workflows() if m.id == "durableruns.E004"]


def test_a_hold_given_back_by_a_run_that_goes_on_is_acquired_again_under_a_key_of_its_own() -> None:
    first = [a("lock", "completed", 1), a("reserve", "completed", 2)]
    assert given_back(ACQ, first) == frozenset()
    assert [acquisition_round(acq, first) for acq in ACQ] == [1, 1]
    assert [release_round(acq, first) for acq in ACQ] == [1, 1]
    released = [*first, a("reserve:release", "completed", 3), a("lock:release", "completed", 4)]
    assert given_back(ACQ, released) == {"lock", "reserve"}
    assert [acquisition_round(acq, released) for acq in ACQ] == [2, 2]
    assert round_key("po-1:lock", 1) == "po-1:lock" and round_key("po-1:lock", 2) == "po-1:lock#2"
    # Completed but given back: not done, so the run acquires them again before the steps that rely on them.
    boundary = compute_boundary(PLAN, released, given_back=given_back(ACQ, released))
    assert boundary.done == [] and boundary.remainder == list(PLAN) and boundary.in_doubt == []
    assert compute_boundary(PLAN, released).done == ["lock", "reserve"]  # an ending run's own view

    again = [*released, a("lock", "completed", 5, attempt=2)]
    assert given_back(ACQ, again) == {"reserve"}
    states = {h.step: h.state for h in assess(PLAN, ACQ, again)}
    assert states == {"lock": HoldState.HELD, "reserve": HoldState.RELEASED}  # the first release was not this one
    assert release_round(ACQ[0], again) == 2  # its release now gives back the second holding, under #2
    lock = assess(PLAN, ACQ, [*again, a("lock:release", "failed", 6, attempt=2)])[0]
    assert (lock.state, lock.release_status, lock.release_attempts) == (HoldState.HELD, "failed", 1)
