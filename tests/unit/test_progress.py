"""ctx.progress's checks and its one-a-second limit, pure: a clock the test moves, a list for the commits."""

from __future__ import annotations

import threading

import pytest

from durableruns.context import StepContext
from durableruns.errors import DeclarationError
from durableruns.progress import MAX_MESSAGE, Progress, checked
from durableruns.tracebacks import FRAMES, LIMIT, error_detail


class Ticking:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def recorder() -> tuple[Progress, list[tuple[str, int | None, int | None]], Ticking]:
    written: list[tuple[str, int | None, int | None]] = []
    clock = Ticking()
    return Progress({}, lambda *report: written.append(report), monotonic=clock), written, clock


@pytest.mark.parametrize(
    ("message", "done", "total", "error"),
    [
        (None, None, None, TypeError),
        (b"bytes", None, None, TypeError),
        ("x" * (MAX_MESSAGE + 1), None, None, ValueError),
        ("nul\x00", None, None, ValueError),
        ("ok", -1, None, ValueError),
        ("ok", None, -5, ValueError),
        ("ok", 1.5, None, TypeError),
        ("ok", "3", None, TypeError),
        ("ok", True, None, TypeError),
        ("ok", None, 2**63, ValueError),
    ],
)
def test_bad_reports_raise_in_the_step_and_commit_nothing(message, done, total, error):
    progress, written, _ = recorder()
    with pytest.raises(error):
        progress(message, done=done, total=total)
    assert written == []


def test_good_reports_pass_the_checks():
    assert checked("x" * MAX_MESSAGE, 0, 0) == ("x" * MAX_MESSAGE, 0, 0)
    assert checked("", None, None) == ("", None, None)


def test_at_most_one_commit_a_second_the_latest_kept_and_flushed_at_the_end():
    progress, written, clock = recorder()
    for i in range(1, 11):
        progress(f"line {i}", done=i, total=10)
        clock.now += 0.05
    assert written == [("line 1", 1, 10)]  # the nine others within its second: held, the latest only
    progress.flush()
    assert written == [("line 1", 1, 10), ("line 10", 10, 10)]
    progress.flush()  # nothing held any more
    assert len(written) == 2


def test_a_report_after_the_second_commits_itself_and_drops_the_held_one():
    progress, written, clock = recorder()
    progress("a")
    clock.now += 0.5
    progress("b")  # held
    clock.now += 0.6
    progress("c")  # a second after "a": committed, "b" superseded
    progress.flush()
    assert written == [("a", None, None), ("c", None, None)]


def test_ctx_progress_is_still_the_checkpointed_dict():
    ctx = StepContext(
        run_id="r", step="s", input={}, results={}, effect_key="k", attempt=1, timeout=None, progress={"priced": [1]}
    )
    ctx.progress.setdefault("priced", []).append(2)
    assert ctx.progress == {"priced": [1, 2]}
    ctx.progress("no writer: checked, recorded nowhere", done=1)  # a lookup's context, a unit test's
    with pytest.raises(TypeError):
        ctx.progress(42)


def test_progress_from_another_thread_is_refused():
    progress, written, _ = recorder()
    caught: list[BaseException] = []

    def report() -> None:
        try:
            progress("from a map thread")
        except DeclarationError as exc:
            caught.append(exc)

    thread = threading.Thread(target=report)
    thread.start()
    thread.join()
    assert caught and written == []


def test_error_detail_keeps_the_last_frames_bounded():
    def deep(n: int) -> None:
        if n == 0:
            raise KeyError("missing_key")
        deep(n - 1)

    try:
        deep(50)
    except KeyError as exc:
        detail = error_detail(exc)
    assert detail.startswith("Traceback (most recent call last):")
    assert detail.endswith("KeyError: 'missing_key'")
    assert 'line' in detail and "test_progress.py" in detail and len(detail) <= LIMIT + 60
    assert "in test_error_detail_keeps_the_last_frames_bounded" not in detail  # the outer frames left out
    assert detail.count('File "') <= FRAMES
