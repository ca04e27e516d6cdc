"""The suite's reading of a worker's stderr (tests/logs.py): a step's logged exception is not a crash."""

from __future__ import annotations

import io
import logging

from tests.logs import stray_tracebacks


def _logged(message: str, *args: object) -> str:
    out = io.StringIO()
    log = logging.getLogger("tests.stray")
    handler = logging.StreamHandler(out)
    log.addHandler(handler)
    try:
        try:
            try:
                raise KeyError("inner")
            except KeyError as exc:
                raise ValueError("outer") from exc
        except ValueError as exc:
            log.error(message, *args, exc_info=exc)
    finally:
        log.removeHandler(handler)
    return out.getvalue()


def test_a_steps_logged_exception_is_not_stray_and_a_crash_is():
    step = _logged("run %s: %s attempt %s raised %s", "PO-1", "quote", 2, "ValueError: outer")
    crash = _logged("Exception in the worker loop")
    assert step.count("Traceback (most recent call last):") == 2  # chained
    assert stray_tracebacks(step) == []
    assert stray_tracebacks(step + "after\n") == []
    [found] = stray_tracebacks(step + crash)
    assert found.startswith("Traceback") and "ValueError: outer" in found
    assert len(stray_tracebacks(crash + step)) == 1
