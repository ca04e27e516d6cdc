"""What a step sees: its run's input and earlier results, its effect key, and a loop that checkpoints itself.

The loop cursor and `progress` are committed together every `every` items, so a new attempt of the step
continues from the last checkpoint and redoes at most `every` items.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from durableruns import testing
from durableruns.errors import DeclarationError

T = TypeVar("T")
Checkpoint = Callable[[int, dict[str, Any]], None]


class StepContext:
    """The argument every step and lookup receives."""

    def __init__(
        self,
        *,
        run_id: str,
        step: str,
        input: Mapping[str, Any],
        results: Mapping[str, Any],
        effect_key: str,
        attempt: int,
        timeout: timedelta,
        progress: dict[str, Any] | None = None,
        loop_start: int = 0,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        self.run_id = run_id
        self.step = step
        self.input = input
        self.results = results
        self.effect_key = effect_key
        self.attempt = attempt
        self.timeout = timeout
        self.progress: dict[str, Any] = progress if progress is not None else {}
        self.loop_start = loop_start
        self._checkpoint = checkpoint
        self._looped = False

    def __repr__(self) -> str:
        return f"<StepContext {self.run_id}/{self.step}#{self.attempt}>"

    def loop(self, items: Sequence[T], every: int = 25) -> Iterator[T]:
        """Yield `items` from the last checkpoint on, committing the index and `progress` every `every` items."""
        if every < 1:
            raise DeclarationError("loop(every=...) must be at least 1")
        if self._looped:
            raise DeclarationError(f"{self.step}: one checkpointed loop per step")
        self._looped = True
        for index in range(self.loop_start, len(items)):
            yield items[index]
            # Control returns here only once the caller has finished item `index`.
            done = index + 1
            testing.reached(f"loop:{done}", self.step)
            if done % every == 0 and done < len(items) and self._checkpoint is not None:
                self._checkpoint(done, self.progress)
