"""Results held to share a later commit (issue 34). PURE: no Django, no I/O.

A step declared `intent=False` (re_executable only: its effect, if any, may happen twice) records no intent, so
nothing of it is durable before its result is, and a crash before that commit runs it again. Its result may
therefore wait in memory, as the step's own progress does between a loop's checkpoints, and go into the commit
of a later step of the same pass: a chain of such steps then costs one commit instead of one each.

The trade is the seed's checkpoint granularity: fewer commits against more rework after a crash. A crash redoes
the held steps with the one in hand, at most DURABLERUNS_HOLD_RESULTS_SECONDS of work plus that step, and never a
step that records an intent: a result is held only while the next step is one that declares none as well, so an
intent is still durable before its step acts, and the held results go into that intent's commit.
"""

from __future__ import annotations

from dataclasses import dataclass

from durableruns.policies import Policy
from durableruns.steps import Step

LIMIT = 100  # results in one commit at most: one statement's arrays stay small


@dataclass(frozen=True, kw_only=True)
class Held:
    """A completed attempt whose result waits for the next commit: it becomes a `completed` row there."""

    step: str
    attempt: int
    effect_key: str
    encoded: str  # the result as JSON, exactly as it will be recorded
    resolution: str = "returned"


def unrecorded(step: Step) -> bool:
    """A step that acts with no intent recorded and gives nothing back: what a chain is made of."""
    return (
        not step.intent
        and step.policy is Policy.RE_EXECUTABLE
        and step.releaser is None
        and step.wait is None
        and step.when is None
        and step.rate is None
    )


def may_hold(step: Step, following: Step | None, *, fresh: bool, held: int, age: float, window: float) -> bool:
    """Whether `step`'s result, just returned, waits for the commit of `following` (the next step of the plan):
    both record no intent, `following` has no attempt yet (`fresh`: it starts at attempt 1, with no history to
    settle), fewer than LIMIT results wait, and the first of them was started less than `window` seconds ago
    (`age`). A window of 0 holds nothing: every result is committed alone."""
    return (
        window > 0
        and following is not None
        and unrecorded(step)
        and unrecorded(following)
        and fresh
        and held + 1 < LIMIT
        and age < window
    )
