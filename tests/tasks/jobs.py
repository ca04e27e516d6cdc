"""Tasks the Tasks backend's tests enqueue. Worker processes import them by their recorded module path."""

from __future__ import annotations

import os
import time
from pathlib import Path

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def add(a: int, b: int, *, times: int = 1) -> dict[str, int]:
    return {"total": (a + b) * times}


@task
def explode(message: str) -> None:
    raise ValueError(message)


@task
def hang_the_first_time(folder: str) -> int:
    """Note each start in `folder`/starts; the first start hangs (its worker is killed there), a later one
    returns how many starts there were."""
    starts = Path(folder) / "starts"
    with starts.open("a") as f:
        f.write(f"{os.getpid()}\n")
    count = len(starts.read_text().splitlines())
    if count == 1:
        (Path(folder) / "first-start").touch()
        time.sleep(120)
    return count


@task(takes_context=True)
def which_attempt(context) -> int:
    return context.attempt


def touch(path: str) -> str:
    """Not a task: a plain function with a far effect (a file appears). A forged task run naming it must not
    call it."""
    Path(path).write_text("called")
    return path


touching_alias = None  # a test points it at a Task declared at another path


@task
def exits() -> None:
    exit(1)


@task
def interrupts() -> None:
    raise KeyboardInterrupt("the task's own")


@task
def returns_a_function():
    return lambda: True
