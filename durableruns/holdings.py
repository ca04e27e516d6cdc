"""What a run holds in other systems, and in what order a run that ends unfinished gives it back. Pure: no Django.

An acquisition is a step declared with `release=`: its completed attempt is a claim that lives in another
system (a lock, a reservation, an authorisation). It stays held until its release step ("<step>:release")
completes, or a later step it is `released_by` completes, or the run completes (a completed run keeps what it
acquired). An acquisition whose own latest attempt is in doubt is *possibly* held: never released blindly,
looked up first where it has a lookup, otherwise listed for staff. Everything here is read from the record
(the attempts), so a crash in the middle of releasing resumes from the same answer.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from durableruns.boundary import StepAttempt

RELEASE_SUFFIX = ":release"


def release_step(step: str) -> str:
    """The name the release of `step` is recorded under in run_step (its effect key follows from it)."""
    return f"{step}{RELEASE_SUFFIX}"


def round_key(key: str, round_: int) -> str:
    """The effect key of an acquisition (or its release) in its `round_`-th holding: the step's own key the first
    time; a run that gave the hold back and goes on acquires it again under a key of its own (`key#2`), which
    the far system must not take for the hold it already gave back (nor its release for the first release)."""
    return key if round_ <= 1 else f"{key}#{round_}"


def _completed(attempts: Sequence[StepAttempt], step: str) -> int:
    return sum(a.step == step and a.status == "completed" for a in attempts)


def acquisition_round(acq: Acquisition, attempts: Sequence[StepAttempt]) -> int:
    """Which holding the next attempt of the acquisition makes: one more than the releases that completed."""
    return _completed(attempts, acq.release_step) + 1


def release_round(acq: Acquisition, attempts: Sequence[StepAttempt]) -> int:
    """Which holding a release of the acquisition gives back: the latest one acquired."""
    return _completed(attempts, acq.step)


def given_back(acquisitions: Sequence[Acquisition], attempts: Sequence[StepAttempt]) -> frozenset[str]:
    """The acquisitions whose latest holding was given back: a run that goes on (it was stopped for a missing
    step, released what it held, and a deploy with the step came back) must acquire them again before the steps
    that rely on them, rather than carry on with a hold it no longer has."""
    if not acquisitions:  # most workflows: nothing to read on each claim
        return frozenset()
    latest = latest_attempts(attempts)
    return frozenset(
        acq.step
        for acq in acquisitions
        if (own := latest.get(acq.step)) is not None
        and own.status == "completed"
        and _completed(attempts, acq.release_step) >= _completed(attempts, acq.step)
    )


@dataclass(frozen=True, kw_only=True)
class Acquisition:
    """A step of the plan declared with release=, as the rules need it."""

    step: str
    release_step: str
    hold_expires_after: timedelta | None = None
    released_by: str = ""
    has_lookup: bool = False


class HoldState(enum.StrEnum):
    """Where one acquisition of a run stands."""

    NOT_ACQUIRED = "not_acquired"  # never attempted, failed, or provably absent
    HELD = "held"  # acquired, not given back
    POSSIBLY_HELD = "possibly_held"  # the acquisition itself is in doubt
    RELEASED = "released"  # its release completed
    HANDED_ON = "handed_on"  # the later step it is released_by completed
    KEPT = "kept"  # the run completed: what it acquired is its outcome


@dataclass(frozen=True, kw_only=True)
class Holding:
    """One acquisition of one run: what it recorded, since when, until when the far system keeps it alone."""

    step: str
    release_step: str
    state: HoldState
    result: Any = None
    since: datetime | None = None
    expires_at: datetime | None = None
    has_lookup: bool = False
    # The release's latest attempt, when one was made: "started" (in doubt) or "failed" while still held.
    release_status: str = ""
    release_attempts: int = 0

    @property
    def is_held(self) -> bool:
        return self.state is HoldState.HELD

    def lapses_in(self, now: datetime) -> timedelta | None:
        """How long until the far system drops the hold on its own (negative once it has), if declared."""
        return None if self.expires_at is None else self.expires_at - now

    def sentence(self, now: datetime) -> str:
        """E.g. 'reserve_stock held since 14:07, lapses in 40 min' for an operator."""
        since = f" since {self.since:%H:%M}" if self.since else ""
        if self.state is HoldState.POSSIBLY_HELD:
            how = "a lookup decides" if self.has_lookup else "no lookup: staff check the far system"
            return f"{self.step} possibly held (in doubt{since}; {how})"
        text = f"{self.step} {self.state.value.replace('_', ' ')}{since}"
        left = self.lapses_in(now)
        if left is not None and self.state is HoldState.HELD:
            text += f", {lapse_phrase(left)}"
        if self.release_status == "failed":
            text += f", its release failed {self.release_attempts} time(s)"
        elif self.release_status == "started":
            text += ", its release is in doubt"
        return text


def lapse_phrase(left: timedelta) -> str:
    """'lapses in 40 min', 'lapsed 5 min ago': what waiting costs, in an operator's words."""
    minutes = int(abs(left.total_seconds()) // 60)
    amount = f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"
    return f"lapses in {amount}" if left >= timedelta(0) else f"lapsed {amount} ago"


def latest_attempts(attempts: Sequence[StepAttempt]) -> dict[str, StepAttempt]:
    """Each step's latest attempt, by step name."""
    latest: dict[str, StepAttempt] = {}
    for a in attempts:
        seen = latest.get(a.step)
        if seen is None or a.attempt > seen.attempt:
            latest[a.step] = a
    return latest


def assess(plan: Sequence[str], acquisitions: Sequence[Acquisition], attempts: Sequence[StepAttempt]) -> list[Holding]:
    """Every acquisition of the plan with its state, in plan order, from the run's attempts (releases included)."""
    latest = latest_attempts(attempts)
    completed_run = bool(plan) and all(step in latest and latest[step].status == "completed" for step in plan)
    out = []
    for acq in acquisitions:
        own = latest.get(acq.step)
        release = latest.get(acq.release_step)
        # A release gives back the latest holding; one that completed before the acquisition was made again
        # (the run went on after giving it back) gave back an earlier holding, not this one.
        releases_done = _completed(attempts, acq.release_step)
        this_round = [
            a
            for a in attempts
            if a.step == acq.release_step
            and a.status != "completed"
            and a.attempt > last_completed(attempts, acq.release_step)
        ]
        handed_on = latest.get(acq.released_by) if acq.released_by else None
        state = HoldState.NOT_ACQUIRED
        if own is not None and own.status == "started":
            state = HoldState.POSSIBLY_HELD
        elif own is not None and own.status == "completed":
            if releases_done >= _completed(attempts, acq.step):
                state = HoldState.RELEASED
            elif handed_on is not None and handed_on.status == "completed":
                state = HoldState.HANDED_ON
            elif completed_run:
                state = HoldState.KEPT
            else:
                state = HoldState.HELD
        since = None
        if own is not None:
            since = own.finished_at if own.status == "completed" else own.started_at
        expires = since + acq.hold_expires_after if since and acq.hold_expires_after else None
        out.append(
            Holding(
                step=acq.step,
                release_step=acq.release_step,
                state=state,
                result=own.result if own is not None and own.status == "completed" else None,
                since=since,
                expires_at=expires,
                has_lookup=acq.has_lookup,
                release_status=release.status if release is not None and this_round else "",
                release_attempts=len(this_round),
            )
        )
    return out


def last_completed(attempts: Sequence[StepAttempt], step: str) -> int:
    """The number of `step`'s latest completed attempt, 0 if none: attempts after it belong to a new holding."""
    return max((a.attempt for a in attempts if a.step == step and a.status == "completed"), default=0)


def held(holdings: Sequence[Holding]) -> list[Holding]:
    """What the run holds or may hold: what the run page, the queue, the API and show_run list."""
    return [h for h in holdings if h.state in (HoldState.HELD, HoldState.POSSIBLY_HELD)]


def release_order(holdings: Sequence[Holding]) -> list[Holding]:
    """What a run ending unfinished must deal with, in order: acquisitions in doubt that a lookup can settle
    first (each is the latest thing the run did), then every held acquisition in reverse order of completion
    (the last acquired is given back first, as locks are unwound). Possibly-held ones without a lookup are not
    in it: nobody can tell whether they exist, so they are listed for staff and never released blindly."""
    in_doubt = [h for h in holdings if h.state is HoldState.POSSIBLY_HELD and h.has_lookup]
    plan_index = {h.step: i for i, h in enumerate(holdings)}
    acquired = sorted(
        (h for h in holdings if h.state is HoldState.HELD),
        key=lambda h: (h.since is not None, h.since or datetime.min, plan_index[h.step]),
        reverse=True,
    )
    return [*in_doubt, *acquired]


def needs_releasing(holdings: Sequence[Holding]) -> bool:
    """Whether a run that ends unfinished must pass through a worker first (to release, or to look up)."""
    return bool(release_order(holdings))


def soonest_lapse(holdings: Sequence[Holding]) -> datetime | None:
    """When the first held acquisition lapses at its far system: what the queue sorts and flags by."""
    times = [h.expires_at for h in holdings if h.state is HoldState.HELD and h.expires_at is not None]
    return min(times) if times else None
