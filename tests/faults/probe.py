"""Instrumentation for worker subprocesses of the fault tests: log every point of every step, then maybe die.

A worker started with DURABLERUNS_WORKFLOW_MODULES=...,tests.faults.probe and FAULTS_PROBE_LOG=<file> appends
one line per event to that file, before the armed kill (if any) fires:

    <pid>.<thread> claim <run_id>     the worker's thread took a run; its events that follow belong to it
    <pid>.<thread> <point> <step>     the engine (or a step, or ctx.loop) reached that point

so a test can check that a kill happened exactly where it was armed, and count the loop items each attempt
priced (a `loop:N` line is item N finished). The durableruns app arms DURABLERUNS_CRASH_AT before it imports
this module; this module re-arms the same kill behind its logger, through testing's public `arm`/`kill_at`.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from durableruns import store, testing

_LOG = os.environ.get("FAULTS_PROBE_LOG", "")


def _write(line: str) -> None:
    # One short O_APPEND write per line: lines from concurrent workers never interleave.
    fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{os.getpid()}.{threading.get_ident()} {line}\n".encode())
    finally:
        os.close(fd)


def _install() -> None:
    target = os.environ.get("DURABLERUNS_CRASH_AT", "")
    kill = testing.kill_at(target, os.environ.get("DURABLERUNS_CRASH_MARKER") or None) if target else None

    def hook(point: str, step: str) -> None:
        _write(f"{point} {step}")
        if kill is not None:
            kill(point, step)

    testing.arm(hook)
    claim = store.claim

    def logged_claim(**kwargs: Any) -> Any:
        claimed = claim(**kwargs)
        if claimed is not None:
            _write(f"claim {claimed.lease.run_id}")
        return claimed

    store.claim = logged_claim  # services.resume_due calls store.claim through the module


if _LOG:
    _install()
