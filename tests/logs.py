"""Reading what a worker wrote on stderr. A step's exception is logged at ERROR with its traceback, on purpose
(a line "run R: S attempt N raised E", then the traceback); any other traceback is the worker itself crashing."""

from __future__ import annotations

import re

_STEP_RAISED = re.compile(r"run \S+: \S+ attempt \d+ raised ")
_HEADER = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


def stray_tracebacks(err: str) -> list[str]:
    """The tracebacks in `err` that are not a step's logged exception: each as its text."""
    lines = err.splitlines()
    stray: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith(_HEADER):
            logged = i > 0 and bool(_STEP_RAISED.search(lines[i - 1]))
            end = _end_of_traceback(lines, i)
            if not logged:
                stray.append("\n".join(lines[i:end]))
            i = end
        else:
            i += 1
    return stray


def _end_of_traceback(lines: list[str], start: int) -> int:
    """The index after the traceback that begins at `start`, chained ones included: its frames are indented, its
    last line is the exception."""
    i = start + 1
    while True:
        while i < len(lines) and (lines[i].startswith(" ") or not lines[i]):
            i += 1
        i += 1  # the exception's line
        rest = [line for line in lines[i : i + 5] if line.strip()][:2]
        if rest and rest[0].startswith(_CHAINED) and len(rest) > 1 and rest[1].startswith(_HEADER):
            i = lines.index(rest[1], i) + 1
            continue
        return min(i, len(lines))
