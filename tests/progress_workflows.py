"""Workflows of the progress tests (issue 33): steps that report progress with ctx.progress, pause past their
lease, get killed mid-step, and raise. Imported by the tests and named in the workers' DURABLERUNS_WORKFLOW_MODULES.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from durableruns import Workflow

MODULES = "tests.workflows,tests.progress_workflows"  # for the worker processes the tests start

progressing = Workflow("progressing")


@progressing.step(policy="re_executable")
def count(ctx: Any) -> dict[str, Any]:
    """Ten reports in well under a second: one commit now, the latest held and committed as the step ends."""
    for i in range(1, 11):
        ctx.progress(f"line {i}", done=i, total=10)
    return {"counted": 10}


@progressing.step(policy="re_executable")
def quiet(ctx: Any) -> dict[str, Any]:
    """Reports nothing."""
    return {"quiet": True}


paused = Workflow("progress_paused")


@paused.step(policy="re_executable")
def slow_count(ctx: Any) -> dict[str, Any]:
    """Reports, then (its first attempt) is paused past its lease and reports again once it wakes."""
    ctx.progress(f"first of attempt {ctx.attempt}", done=1, total=2)
    mark = os.environ.get("TEST_PROGRESS_MARK")
    if mark and ctx.attempt == 1:
        Path(mark).touch()  # the test stops the process here, past its lease
        time.sleep(3)
        ctx.progress("after the pause", done=2, total=2)  # another worker has the run: fenced, nothing written
    return {"attempt": ctx.attempt}


crawling = Workflow("progress_crawl")


@crawling.step(policy="re_executable")
def crawl(ctx: Any) -> dict[str, Any]:
    """Five reports a little over a second apart; the first attempt waits at the second for the test to kill it."""
    for i in range(1, 6):
        ctx.progress(f"crawled {i} (attempt {ctx.attempt})", done=i, total=5)
        mark = os.environ.get("TEST_PROGRESS_MARK")
        if mark and i == 2 and ctx.attempt == 1:
            Path(mark).touch()
            time.sleep(60)  # SIGKILLed here
        time.sleep(float(os.environ.get("TEST_CRAWL_GAP", "0.3")))
    return {"crawled": 5}


@crawling.step(policy="re_executable")
def wrap_up(ctx: Any) -> dict[str, Any]:
    return {"wrapped": True}


breaking = Workflow("progress_breaks")


@breaking.step(policy="re_executable", max_attempts=1)
def breaks(ctx: Any) -> dict[str, Any]:
    """Fails: a KeyError from a line the test finds in the traceback."""
    ctx.progress("about to look it up")
    return {"value": lookup_missing({})}


def lookup_missing(table: dict[str, Any]) -> Any:
    return table["missing_key"]  # RAISES_HERE


doubting = Workflow("progress_doubt")


@doubting.step(policy="escalate")
def unsure(ctx: Any) -> dict[str, Any]:
    """Raises something no declared rejection covers: in doubt, for a person."""
    raise RuntimeError("the far system hung up")
