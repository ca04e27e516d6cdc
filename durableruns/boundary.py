"""The recovery boundary: which steps are done, which are in doubt, which remain, from the record alone.

This module is pure (no Django, no I/O) so the rule that decides every resume can be tested exhaustively.
A step's latest attempt decides its state; a `started` attempt with no outcome is in doubt, never failed.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Any

from durableruns.rates import waiting_reason


class Zone(enum.StrEnum):
    """Where a step of the plan stands on the boundary."""

    DONE = "done"
    IN_DOUBT = "in_doubt"
    FAILED = "failed"
    WAITING = "waiting"  # a wait step begun: a sleep, a wait for an event, an approval, a join (durableruns.waits)
    NOT_STARTED = "not_started"


@dataclass(frozen=True, kw_only=True)
class StepAttempt:
    """One attempt at one step, as recorded in run_step."""

    step: str
    attempt: int
    status: str  # started | completed | failed
    effect_key: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    renewed_at: datetime | None = None  # the last renewal while it was in hand: its process was alive then
    held_until: datetime | None = None  # the lease expiry its worker last held: the last moment it could call
    raised_at: datetime | None = None  # when it raised in a live worker: its call was over then
    loop_cursor: int = 0
    progress: Mapping[str, Any] = field(default_factory=dict)
    result: Any = None
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class Boundary:
    """The partition of a plan computed at the top of a resume; lists hold step names in plan order.

    `remainder` is every step not done, the in-doubt and failed ones included (as in the design source).
    """

    plan: tuple[str, ...]
    done: list[str]
    in_doubt: list[str]
    failed: list[str]
    remainder: list[str]
    latest: Mapping[str, StepAttempt]
    status: str | None = None
    # False when the run's plan is not recorded (durableruns.plans): the plan is only the steps ever attempted.
    plan_known: bool = True
    # Wait steps (durableruns.waits) begun and not over, by name -> kind: waiting, not in doubt (nothing acted).
    waiting: Mapping[str, str] = field(default_factory=dict)
    # Steps whose next attempt waits for its turn under the step's rate limit (durableruns.rates), by name ->
    # (key, the moment the turn comes).
    turns: Mapping[str, tuple[str, datetime]] = field(default_factory=dict)
    # A debounced run not yet begun (durableruns.start(debounce=, key=)): when it starts, unless a start with its
    # key moves that time on.
    debounced_until: datetime | None = None
    # When the run must have ended (durableruns.deadlines), if it has a deadline: the sentence names it.
    deadline: datetime | None = None
    # The run's attributes (durableruns.attributes), name -> str or int: filled by boundary(run_id), the edges'
    # read of one run; empty where a list computes many boundaries.
    attributes: Mapping[str, str | int] = field(default_factory=dict)

    def zone(self, step: str) -> Zone:
        """Return the zone of one step of the plan."""
        if step in self.done:
            return Zone.DONE
        if step in self.in_doubt:
            return Zone.IN_DOUBT
        if step in self.failed:
            return Zone.FAILED
        if step in self.waiting:
            return Zone.WAITING
        return Zone.NOT_STARTED

    def sentence(self, tz: tzinfo | None = None) -> str:
        """Say where the run stands, e.g. '6 steps complete, charge in doubt since 14:07, 3 steps remaining'."""
        return operator_sentence(self, tz)

    def __str__(self) -> str:
        return self.sentence()


def compute_boundary(
    plan: Sequence[str],
    attempts: Sequence[StepAttempt],
    *,
    given_back: Collection[str] = (),
    waits: Mapping[str, str] | None = None,
    turns: Mapping[str, tuple[str, datetime]] | None = None,
) -> Boundary:
    """Partition `plan` by the latest attempt of each step; attempts of steps not in the plan are ignored.

    `given_back` names acquisitions whose hold the run gave back (durableruns.holdings.given_back) while it goes
    on: completed, but not done, since what they acquired is gone; they remain, to be acquired again. `waits`
    names the plan's wait steps (name -> kind): a begun one is waiting, not in doubt. `turns`: the turns the
    run waits for under rate limits (step -> (key, time)); those of steps done or in doubt are left out."""
    waits = waits or {}
    latest: dict[str, StepAttempt] = {}
    for a in attempts:
        seen = latest.get(a.step)
        if seen is None or a.attempt > seen.attempt:
            latest[a.step] = a
    done: list[str] = []
    in_doubt: list[str] = []
    failed: list[str] = []
    remainder: list[str] = []
    waiting: dict[str, str] = {}
    for step in plan:
        last = latest.get(step)
        if last is not None and last.status == "completed" and step not in given_back:
            done.append(step)
            continue
        remainder.append(step)
        if last is None:
            continue
        if last.status == "started" and step in waits:
            waiting[step] = waits[step]  # a wait begun: nothing acted, nothing in doubt
        elif last.status == "started":
            in_doubt.append(step)  # intent recorded, outcome unknown
        elif last.status == "failed":
            failed.append(step)
    return Boundary(
        plan=tuple(plan),
        done=done,
        in_doubt=in_doubt,
        failed=failed,
        remainder=remainder,
        latest={s: latest[s] for s in plan if s in latest},
        waiting=waiting,
        turns={s: t for s, t in (turns or {}).items() if s in remainder and s not in in_doubt},
    )


def _count(n: int) -> str:
    return f"{n} step{'' if n == 1 else 's'}"


def operator_sentence(b: Boundary, tz: tzinfo | None = None) -> str:
    """Render the boundary as one sentence an operator can act on."""
    if b.plan_known and not b.remainder:
        return f"all {_count(len(b.done))} complete"
    parts = [f"{_count(len(b.done))} complete"]
    for step in b.in_doubt:
        since = b.latest[step].started_at
        parts.append(f"{step} in doubt since {_clock(since, tz)}" if since else f"{step} in doubt")
    for step in b.failed:
        parts.append(f"{step} failed (attempt {b.latest[step].attempt})")
    for step, kind in b.waiting.items():  # a run that ended meanwhile (cancelled) waits no more
        ended = b.status in ("completed", "failed", "cancelled")
        parts.append(f"{step} stopped waiting" if ended else _waiting(step, kind, b.latest[step], tz))
    if b.status in (None, "waiting"):  # a turn is waited for only while the run waits
        for step, (key, until) in b.turns.items():
            parts.append(waiting_reason(step, key, until.astimezone(tz) if tz else until))
    if b.debounced_until is not None and b.status in (None, "waiting"):
        parts.append(f"debounced until {_clock(b.debounced_until, tz, '%H:%M:%S')} (a start with its key moves it)")
    if b.plan_known:
        parts.append(f"{_count(len(b.remainder))} remaining")
    else:
        parts.append("the rest unknown: the run's plan is not recorded")
    if b.deadline is not None and b.status not in ("completed", "failed", "cancelled"):
        parts.append(f"deadline {_clock(b.deadline, tz, '%Y-%m-%d %H:%M %Z')}".rstrip())
    return ", ".join(parts)


def _clock(when: datetime, tz: tzinfo | None, fmt: str = "%H:%M") -> str:
    return (when.astimezone(tz) if tz else when).strftime(fmt)


def _waiting(step: str, kind: str, attempt: StepAttempt, tz: tzinfo | None) -> str:
    """What a begun wait waits for and until when (its attempt's progress records `until`: durableruns.waits)."""
    text = (attempt.progress or {}).get("until")
    until = datetime.fromisoformat(text) if isinstance(text, str) else None
    day = "%Y-%m-%d %H:%M"
    if kind == "sleep":
        return f"{step} sleeping until {_clock(until, tz, day)}" if until else f"{step} sleeping"
    what = {"approval": f"approval {step}", "join": f"its child runs at {step}"}.get(kind, step)
    since = f" since {_clock(attempt.started_at, tz)}" if attempt.started_at else ""
    if until is None:
        return f"waiting for {what}{since}"
    return f"waiting for {what}{since} (times out {_clock(until, tz, day)})"
