"""Fault injection for tests of durable runs: kill the worker at a named point of a step's cycle. Its public
face is durableruns.testing, which re-exports these names; the engine and the worker call them here.

The engine calls `reached(point, step)` at each point; it does nothing unless a fault is armed, either in
process (`arm`) or, for a worker started as a subprocess, by the environment:

    DURABLERUNS_CRASH_AT="charge@after_intent"      # step@point; a loop point is "quote@loop:173"
    DURABLERUNS_CRASH_MARKER=/tmp/x                  # optional: crash only once (the marker file is created)

Points, in cycle order: before_intent (for a fresh run's first step, whose intent rides on the claim: before
the claim's commit, nothing recorded), after_intent (intent committed, far system not called yet),
after_effect (called by the step itself once the far system accepted), loop:N (item N of ctx.loop done),
after_return (the step returned, its result not committed). A bulk act's point is "bulk:N", its step the act
("retry@bulk:70"): the worker's Nth item acted on, inside the batch's commit (durableruns.bulks).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

Hook = Callable[[str, str], None]

POINTS = ("before_intent", "after_intent", "after_effect", "after_return")
_hook: Hook | None = None


def reached(point: str, step: str) -> None:
    """Mark that the worker reached `point` of `step`; a no-op unless a fault is armed."""
    if _hook is not None:
        _hook(point, step)


def armed() -> bool:
    """Whether a fault is armed in this process."""
    return _hook is not None


def arm(hook: Hook | None) -> None:
    """Install (or with None, remove) the in-process hook called at every point."""
    global _hook
    _hook = hook


def kill_at(target: str, marker: str | None = None) -> Hook:
    """A hook that SIGKILLs this process at `step@point`, once if `marker` names a file to create."""
    step, _, point = target.partition("@")

    def hook(at: str, at_step: str) -> None:
        if at_step != step or at != point:
            return
        if marker:
            path = Path(marker)
            if path.exists():
                return
            path.touch()
        os.kill(os.getpid(), signal.SIGKILL)

    return hook


def arm_from_environment() -> None:
    """Arm the kill named by DURABLERUNS_CRASH_AT, if any (called when the app starts)."""
    target = os.environ.get("DURABLERUNS_CRASH_AT")
    if target:
        arm(kill_at(target, os.environ.get("DURABLERUNS_CRASH_MARKER")))
