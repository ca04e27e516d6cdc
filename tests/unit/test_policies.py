"""In-doubt policies as a pure table: unknown is never failed, absence is trusted only after the lag."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from durableruns.boundary import StepAttempt
from durableruns.policies import (
    Action,
    Next,
    Outcome,
    Policy,
    absence_provable_at,
    after_failure,
    after_lookup,
    after_lookup_error,
    cap_attempts,
    cap_crashes,
    crash_looped,
    last_call_bound,
    lookup_errors,
    settle_in_doubt,
)

T0 = datetime(2026, 8, 8, 14, 7, 12, tzinfo=timezone.utc)
LEASE = timedelta(seconds=30)
# Taken at T0 under a 30 s lease, its worker lost before any renewal: it could have called until T0 + 30 s.
DOUBT = StepAttempt(step="charge", attempt=1, status="started", effect_key="run-1:charge", started_at=T0,
                    held_until=T0 + LEASE)


@pytest.mark.parametrize(
    ("policy", "escalation_open", "staff", "action"),
    [
        (Policy.RE_EXECUTABLE, False, None, Action.RUN),
        (Policy.RESOLVABLE, False, None, Action.LOOK_UP),
        (Policy.ESCALATE, False, None, Action.ESCALATE),
        (Policy.ESCALATE, True, None, Action.HOLD),
        (Policy.ESCALATE, False, Outcome.DID_NOT_HAPPEN, Action.RUN),
        (Policy.ESCALATE, False, Outcome.HAPPENED, Action.COMPLETE),
        (Policy.ESCALATE, False, Outcome.ABANDON, Action.CANCEL),
    ],
)
def test_first_move_by_policy(policy, escalation_open, staff, action):
    assert settle_in_doubt(policy, attempt=DOUBT, escalation_open=escalation_open, staff_outcome=staff).action is action


LAG = timedelta(seconds=60)
TIMEOUT = timedelta(seconds=30)


@pytest.mark.parametrize(
    ("found", "elapsed", "action"),
    [
        ({"charge_id": "ch_1"}, 1, Action.COMPLETE),  # found: done, whatever the time
        (None, 1, Action.WAIT),  # not found 1 s after: might be the replica's lag
        (None, 90, Action.WAIT),  # start + timeout + lag: the call may have been made as late as the lease's end
        (None, 119, Action.WAIT),  # one second before lease + timeout + lag
        (None, 120, Action.RUN),  # exactly the held lease's end + timeout + lag: absence is provable
        (None, 600, Action.RUN),
    ],
)
def test_lookup_is_trusted_only_after_the_held_lease_the_timeout_and_the_lag(found, elapsed, action):
    verdict = after_lookup(found, attempt=DOUBT, now=T0 + timedelta(seconds=elapsed), timeout=TIMEOUT, lookup_lag=LAG,
                           lease=LEASE)
    assert verdict.action is action
    if action is Action.WAIT:
        assert verdict.until == T0 + LEASE + TIMEOUT + LAG
    if action is Action.COMPLETE:
        assert verdict.result == found


def test_a_lookup_that_raised_is_asked_again_never_taken_as_absence():
    verdict = after_lookup_error("TimeoutError", now=T0, retry_in=timedelta(seconds=5))
    assert verdict.action is Action.WAIT and verdict.until == T0 + timedelta(seconds=5)


@pytest.mark.parametrize(
    ("made", "expected", "delay"),
    [(1, Action.WAIT, 1), (2, Action.WAIT, 2), (3, Action.WAIT, 4), (4, Action.FAIL, None)],
)
def test_failures_back_off_then_fail(made, expected, delay):
    verdict = after_failure(attempts_made=made, max_attempts=4, now=T0, backoff=timedelta(seconds=1),
                            backoff_max=timedelta(seconds=300))
    assert verdict.action is expected
    if delay is not None:
        assert verdict.until == T0 + timedelta(seconds=delay)


def test_backoff_is_capped_and_zero_backoff_runs_at_once():
    capped = after_failure(attempts_made=20, max_attempts=30, now=T0, backoff=timedelta(seconds=1),
                           backoff_max=timedelta(seconds=300))
    assert capped.until == T0 + timedelta(seconds=300)
    assert after_failure(attempts_made=1, max_attempts=3, now=T0, backoff=timedelta(0),
                         backoff_max=timedelta(0)).action is Action.RUN


def test_cap_turns_only_runs_into_failures():
    run = Next(action=Action.RUN)
    assert cap_attempts(run, failures=3, max_attempts=3).action is Action.FAIL
    assert cap_attempts(run, failures=2, max_attempts=3).action is Action.RUN
    wait = Next(action=Action.WAIT, until=T0)
    assert cap_attempts(wait, failures=9, max_attempts=3) is wait


def test_crashes_never_fail_a_run_they_stop_it_for_staff_once_the_budget_is_used():
    run = Next(action=Action.RUN)
    assert cap_crashes(run, step="quote", crashes=99, max_crashes=100) is run
    stopped = cap_crashes(run, step="quote", crashes=100, max_crashes=100)
    assert stopped.action is Action.STOP and "quote" in stopped.reason and "100" in stopped.reason
    wait = Next(action=Action.WAIT, until=T0)
    assert cap_crashes(wait, step="quote", crashes=500, max_crashes=100) is wait


def _attempt(**times: int) -> StepAttempt:
    return StepAttempt(step="charge", attempt=1, status="started", started_at=T0,
                       **{name: T0 + timedelta(seconds=at) for name, at in times.items()})


@pytest.mark.parametrize(
    ("times", "bound"),
    [
        # lost before any renewal: it could still call until the lease it took ran out
        ({"held_until": 30}, 30),
        # lost after a renewal at 40 s: a renewal proves the worker alive then, not silent after; its lease ran to 70
        ({"renewed_at": 40, "held_until": 70}, 70),
        # raised in its live worker at 12 s: its call was over then, whatever lease it held afterwards
        ({"renewed_at": 10, "held_until": 70, "raised_at": 12}, 12),
        # recorded before held_until existed: its last renewal (or start) plus the lease
        ({"renewed_at": 40}, 70),
        ({}, 30),
    ],
)
def test_the_last_moment_the_call_could_have_been_made(times, bound):
    attempt = _attempt(**times)
    assert last_call_bound(attempt, lease=LEASE) == T0 + timedelta(seconds=bound)
    assert absence_provable_at(attempt, timeout=TIMEOUT, lookup_lag=LAG, lease=LEASE) == (
        T0 + timedelta(seconds=bound) + TIMEOUT + LAG)


def test_a_renewal_does_not_make_absence_provable_before_the_lease_it_took_ran_out():
    """The issue's case, with its figures: a worker (lease 6 s) renewed at 2 s, called at 3.5 s, died; the far
    system committed 5.8 s after the call. "Not found" at 8 s (renewal + timeout) is lateness, not absence."""
    six = timedelta(seconds=6)
    renewed = _attempt(renewed_at=2, held_until=8)
    far_commit = T0 + timedelta(seconds=3.5 + 5.8)
    early = after_lookup(None, attempt=renewed, now=T0 + timedelta(seconds=8), timeout=six, lookup_lag=timedelta(0),
                         lease=six)
    assert early.action is Action.WAIT and early.until == T0 + timedelta(seconds=14) > far_commit


def test_a_lookup_that_keeps_raising_stops_for_staff_once_its_budget_is_spent_counting_from_the_reason():
    pay = StepAttempt(step="pay (card)", attempt=2, status="started", effect_key="po-1:pay (card)")
    reason, counted = "", []
    for _ in range(3):  # each pass reads the count back from the reason the last wait recorded
        errors = lookup_errors(reason, attempt=pay) + 1
        verdict = after_lookup_error("TimeoutError: (x)", now=T0, retry_in=timedelta(0), attempt=pay, errors=errors,
                                     max_errors=3)
        counted.append((errors, verdict.action))
        reason = verdict.reason + " (the call raised OSError)"  # what the engine may append
    assert counted == [(1, Action.WAIT), (2, Action.WAIT), (3, Action.STOP)]
    assert "raised 3 times in a row" in reason and "TimeoutError: (x)" in reason and "po-1:pay (card)" in reason
    # Another attempt, another step, or a reason that is not a lookup's wait: counting starts again
    wait = after_lookup_error("E", now=T0, retry_in=timedelta(0), attempt=pay, errors=2, max_errors=3).reason
    assert lookup_errors(wait, attempt=pay) == 2
    assert lookup_errors(wait, attempt=StepAttempt(step="pay (card)", attempt=3, status="started")) == 0
    assert lookup_errors(wait, attempt=StepAttempt(step="card)", attempt=2, status="started")) == 0
    assert lookup_errors("pay (card) not found yet", attempt=pay) == 0


def test_a_run_whose_worker_keeps_dying_with_nothing_recorded_stops_at_the_crash_budget():
    assert crash_looped(takeovers=99, max_crashes=100, step="price_1") == ""
    stopped = crash_looped(takeovers=100, max_crashes=100, step="price_1")
    assert "died 100 times in a row at price_1" in stopped and "crash budget of 100" in stopped
    assert "staff decide" in stopped
