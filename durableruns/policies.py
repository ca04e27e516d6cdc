"""What to do with a step the boundary puts in doubt, by the policy its plan declares. Pure: no Django, no I/O.

Unknown is never treated as failed. Each function here turns facts (the in-doubt attempt, the clock, a lookup's
answer, a staff decision) into one `Next` action; the engine carries it out.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from durableruns.boundary import StepAttempt


class Policy(enum.StrEnum):
    """How an in-doubt step is settled, declared per step."""

    RE_EXECUTABLE = "re_executable"  # running it again leaves the world as one run would
    RESOLVABLE = "resolvable"  # the far system can be asked by the run's own key
    ESCALATE = "escalate"  # nobody can tell automatically: a person decides


class Outcome(enum.StrEnum):
    """A person's decision on an escalated step."""

    HAPPENED = "happened"
    DID_NOT_HAPPEN = "did_not_happen"
    ABANDON = "abandon"


class Action(enum.StrEnum):
    RUN = "run"  # start a new attempt under the same effect key, from the last loop checkpoint
    LOOK_UP = "look_up"  # ask the far system for the effect by the run's own key
    COMPLETE = "complete"  # record the in-doubt attempt completed with a known result
    WAIT = "wait"  # not decidable yet: release the run until `until`
    ESCALATE = "escalate"  # open an escalation and stop before anything after this step
    HOLD = "hold"  # an escalation is open: stop, do nothing
    CANCEL = "cancel"  # a person abandoned the run
    FAIL = "fail"  # observed failures exhausted the attempts: the run fails
    STOP = "stop"  # the step ended in doubt too often (crashes): stop for staff, never failed


@dataclass(frozen=True, kw_only=True)
class Next:
    """The one thing to do next about a step, and why."""

    action: Action
    until: datetime | None = None
    result: Any = None
    reason: str = ""


def settle_in_doubt(
    policy: Policy,
    *,
    attempt: StepAttempt,
    escalation_open: bool = False,
    staff_outcome: Outcome | None = None,
) -> Next:
    """Choose the first move for an in-doubt attempt; never `RUN` a step whose effect might exist unless the
    policy says running again is safe."""
    if policy is Policy.RE_EXECUTABLE:
        return Next(action=Action.RUN, reason=f"{attempt.step} is re-executable: running it again")
    if policy is Policy.RESOLVABLE:
        return Next(action=Action.LOOK_UP, reason=f"looking up {attempt.step} by key {attempt.effect_key}")
    if staff_outcome is Outcome.DID_NOT_HAPPEN:
        return Next(action=Action.RUN, reason=f"staff decided {attempt.step} did not happen: running it again")
    if staff_outcome is Outcome.ABANDON:
        return Next(action=Action.CANCEL, reason=f"staff abandoned the run at {attempt.step}")
    if staff_outcome is Outcome.HAPPENED:
        return Next(action=Action.COMPLETE, reason=f"staff decided {attempt.step} happened")
    if escalation_open:
        return Next(action=Action.HOLD, reason=f"{attempt.step} awaits a staff decision")
    return Next(action=Action.ESCALATE, reason=f"{attempt.step} is in doubt and has no lookup: a person decides")


def last_call_bound(attempt: StepAttempt, *, lease: timedelta) -> datetime:
    """Return the last moment the attempt's worker could still have made its call, from the record alone.

    - It raised in a live worker (`raised_at`): its call was over then.
    - Otherwise its worker was lost, at some unknown moment before its lease ran out, and it may have called at
      any moment up to then: the lease expiry it last held (`held_until`). A renewal proves only that the worker
      was alive at the renewal, not that it made no call after it.
    - An attempt recorded before `held_until` existed: its last renewal (or its start) plus `lease`.
    """
    if attempt.raised_at is not None:
        return attempt.raised_at
    if attempt.held_until is not None:
        return attempt.held_until
    alive = attempt.renewed_at or attempt.started_at
    if alive is None:
        raise ValueError(f"attempt {attempt.attempt} of {attempt.step} has no start time")
    return alive + lease


def absence_provable_at(
    attempt: StepAttempt, *, timeout: timedelta, lookup_lag: timedelta, lease: timedelta
) -> datetime:
    """Return when a 'not found' stops being lateness: the last moment the attempt's worker could still have made
    the call (`last_call_bound`), plus the time the call may stay open, plus the lookup's lag."""
    return last_call_bound(attempt, lease=lease) + timeout + lookup_lag


def after_lookup(
    found: Mapping[str, Any] | None,
    *,
    attempt: StepAttempt,
    now: datetime,
    timeout: timedelta,
    lookup_lag: timedelta,
    lease: timedelta,
) -> Next:
    """Settle a resolvable step from a lookup by its key: found is done; absent is trusted only after the lag."""
    if found is not None:
        return Next(action=Action.COMPLETE, result=dict(found), reason=f"{attempt.step} found by key")
    provable = absence_provable_at(attempt, timeout=timeout, lookup_lag=lookup_lag, lease=lease)
    if now >= provable:
        return Next(action=Action.RUN, reason=f"{attempt.step} provably absent: running it again under the same key")
    return Next(
        action=Action.WAIT,
        until=provable,
        reason=f"{attempt.step} not found yet; absence is provable only once its call could have landed and the "
        "far system's lag has passed",
    )


def after_lookup_error(
    error: str,
    *,
    now: datetime,
    retry_in: timedelta,
    attempt: StepAttempt | None = None,
    errors: int = 1,
    max_errors: int | None = None,
) -> Next:
    """A lookup that raised proves nothing: ask again later; once the lookup of the same in-doubt `attempt` has
    raised `max_errors` times in a row (`errors`, this one included), stop for staff with its last error.

    Neither outcome is taken as found or absent. The count is written into the reason of the run's wait
    (lookup_errors reads it back), so whichever process asks next counts on from the record."""
    if attempt is None:
        return Next(action=Action.WAIT, until=now + retry_in, reason=f"lookup raised ({error}); asking again later")
    if max_errors is not None and errors >= max_errors:
        return Next(
            action=Action.STOP,
            reason=(
                f"the lookup of {attempt.step} raised {errors} times in a row, its budget of {max_errors}; the last "
                f"time: {error}. Nothing shows whether {attempt.step} took effect: staff check the far system by "
                f"its key {attempt.effect_key}, then retry the run (the lookup is asked again) or cancel it"
            ),
        )
    budget = f" of {max_errors}" if max_errors is not None else ""
    return Next(
        action=Action.WAIT,
        until=now + retry_in,
        reason=f"lookup raised ({error}); asking again later {_tally(attempt, errors, budget)}",
    )


def _tally(attempt: StepAttempt, errors: int, budget: str) -> str:
    return f"(raised {errors}{budget} times in a row by attempt {attempt.attempt} of {attempt.step})"


def lookup_errors(reason: str, *, attempt: StepAttempt) -> int:
    """How many times in a row the lookup of the in-doubt `attempt` has raised, as the run's reason says (the
    wait after_lookup_error recorded); 0 when the reason is anything else (it found, it waited for the lag,
    staff retried)."""
    tail = re.escape(f" times in a row by attempt {attempt.attempt} of {attempt.step})")
    found = re.findall(r"\(raised (\d+)(?: of \d+)?" + tail, reason)
    return int(found[-1]) if found else 0


def after_failure(
    *,
    attempts_made: int,
    max_attempts: int,
    now: datetime,
    backoff: timedelta,
    backoff_max: timedelta,
) -> Next:
    """After an observed failure: retry with exponential backoff until `max_attempts`, then fail the run."""
    if attempts_made >= max_attempts:
        return Next(action=Action.FAIL, reason=f"failed {attempts_made} of {max_attempts} attempts")
    delay = min(backoff_max, backoff * (2 ** (attempts_made - 1)))
    if delay <= timedelta(0):
        return Next(action=Action.RUN, reason=f"retrying (attempt {attempts_made + 1} of {max_attempts})")
    return Next(action=Action.WAIT, until=now + delay, reason=f"retrying after {delay.total_seconds():g}s")


def cap_attempts(verdict: Next, *, failures: int, max_attempts: int) -> Next:
    """Turn a re-run after observed failures into the run's failure once the step has used its attempts."""
    if verdict.action is Action.RUN and failures >= max_attempts:
        return Next(action=Action.FAIL, reason=f"gave up after {failures} of {max_attempts} attempts")
    return verdict


def crash_looped(*, takeovers: int, max_crashes: int, step: str) -> str:
    """Why a run stops for staff after `takeovers` claims in a row took it over from a worker that died at
    `step` with nothing recorded in doubt (the steps from there declared intent=False record no attempt before
    they act, so the crash budget has nothing else to count); "" while it may go on. Like cap_crashes: a crash
    is not a failure, and it must not loop for ever, taking a worker down each time."""
    if takeovers < max_crashes:
        return ""
    return (
        f"its worker died {takeovers} times in a row at {step} with nothing recorded (steps declared "
        f"intent=False record no attempt before they act): the crash budget of {max_crashes} is used up; staff "
        "decide (retry it, or cancel the run)"
    )


def cap_crashes(verdict: Next, *, step: str, crashes: int, max_crashes: int) -> Next:
    """Stop an automatic re-run for staff once the step has ended in doubt `max_crashes` times.

    A crash is not a failure: the process died, or the call raised something that proves nothing, so nothing
    was observed to fail and the run must never be `failed` for it. It still must not loop for ever."""
    if verdict.action is Action.RUN and crashes >= max_crashes:
        return Next(
            action=Action.STOP,
            reason=(
                f"{step} ended in doubt {crashes} times (the worker died, or the call raised without an answer): the "
                f"crash budget of {max_crashes} is used up; staff decide (retry it, or cancel the run)"
            ),
        )
    return verdict
