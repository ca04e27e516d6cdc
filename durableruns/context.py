"""What a step sees: its run's input and earlier results, its effect key, a loop that checkpoints itself, a
map that runs items on threads and checkpoints the results of those that finished, and child runs it starts.

The loop cursor and `progress` are committed together every `every` items, so a new attempt of the step
continues from the last checkpoint and redoes at most `every` items. `map` keeps the results it has collected
under MAP_KEY in the same `progress` (hidden from the step's own `ctx.progress`), so a new attempt calls its
function only for the items no checkpoint holds.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from django.db import connections

from durableruns import faults
from durableruns.attributes import checked
from durableruns.encoding import to_json
from durableruns.errors import DeclarationError, ResultNotJSON
from durableruns.progress import Progress, Write

T = TypeVar("T")
R = TypeVar("R")
Checkpoint = Callable[[int, dict[str, Any]], None]
StartChild = Callable[[Any, Any, Any], str]  # (workflow or its name, input, key) -> run_id

# Where map results live inside the attempt's progress: {"<nth map of the step>": {"<item index>": result}}.
MAP_KEY = "durableruns.map"


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
        start_child: StartChild | None = None,
        attributes: dict[str, Any] | None = None,
        report: Write | None = None,
    ) -> None:
        self.run_id = run_id
        self.step = step
        self.input = input
        self.results = results
        self.effect_key = effect_key
        self.attempt = attempt
        self.timeout = timeout
        # A dict (what a checkpointed loop commits) and callable: ctx.progress(message, done=, total=).
        self.progress: Progress = Progress(progress, report)
        self._reports = self.progress  # the one the engine flushes, even if the step rebinds ctx.progress
        # The maps' collected results are the record's, not the step's: kept apart, committed with progress.
        self._maps: dict[str, dict[str, Any]] = self.progress.pop(MAP_KEY, None) or {}
        self._map_calls = 0
        self._unsaved = 0  # map results collected since the last checkpoint
        self.loop_start = loop_start
        self._loop_cursor = loop_start  # the loop position as last committed
        self._checkpoint = checkpoint
        self._looped = False
        self._start_child = start_child
        self._attributes = attributes  # where set_attributes keeps them for the step's result commit
        self._thread = threading.get_ident()  # the engine's thread: the only one that writes the record

    def __repr__(self) -> str:
        return f"<StepContext {self.run_id}/{self.step}#{self.attempt}>"

    def start_run(self, workflow: Any, input: Any, *, key: Any) -> str:
        """Start a child run of `workflow` (a Workflow or its name) with `input`; return its run_id.

        The run_id is derived from this run, this step and `key` ("<run_id>/<step>/<key>"), and the child is
        recorded at once, in its own commit, with this run as its parent: a step run again after a crash gets
        the same child back (same key and input), never a second one; the same key with another input raises
        InvalidInput. A join step later waits until every child ended. Only the step's own thread may start
        children (not ctx.map's threads: they hold nothing of the run's)."""
        if self._start_child is None:
            raise DeclarationError(f"{self.step}: start_run is for a step's call, not a lookup or a when=")
        if threading.get_ident() != self._thread:
            raise DeclarationError(f"{self.step}: start_run from ctx.map's threads: start children from the step")
        return self._start_child(workflow, input, key)

    def set_attributes(self, **values: Any) -> None:
        """Add or replace attributes of this run (durableruns.attributes), recorded with this step's result in
        the same commit: a step that raises afterwards, or a worker that crashes or is fenced out before that
        commit, records none. A bad name or value is InvalidInput, raised here: the attempt fails with it."""
        if self._attributes is None:
            raise DeclarationError(f"{self.step}: set_attributes is for a step's call, not a lookup or a when=")
        if threading.get_ident() != self._thread:
            raise DeclarationError(f"{self.step}: set_attributes from ctx.map's threads: set them from the step")
        self._attributes.update(checked(values, where=f"step {self.step}"))

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
            faults.reached(f"loop:{done}", self.step)
            if done % every == 0 and done < len(items):
                self._save(done)

    def map(self, fn: Callable[[T], R], items: Iterable[T], *, concurrency: int = 8, every: int = 25) -> list[Any]:
        """Call `fn(item)` for each item on up to `concurrency` threads; return the results in item order.

        Results are committed every `every` finished items (and when an item raises, or the step does), so a
        new attempt calls `fn` only for the items no checkpoint holds. After the first exception no new item
        starts; it is raised once the items in flight have finished (and their results are committed).

        Only this thread writes the record: the threads get no database connection of the run's (one they
        open is their own, closed when they end). Results must be JSON; a new attempt sees them as JSON gives
        them back, and so does this one (a tuple comes back as a list), so a resumed step sees no difference.
        """
        if concurrency < 1:
            raise DeclarationError("map(concurrency=...) must be at least 1")
        if every < 1:
            raise DeclarationError("map(every=...) must be at least 1")
        items = list(items)
        # The nth map of the step: a new attempt of the same code makes the same calls in the same order.
        done = self._maps.setdefault(str(self._map_calls), {})
        self._map_calls += 1
        todo = [i for i in range(len(items)) if str(i) not in done]
        if todo:
            self._run_items(fn, items, todo, done, concurrency=concurrency, every=every)
        return [done[str(i)] for i in range(len(items))]

    def _run_items(
        self,
        fn: Callable[[T], R],
        items: list[T],
        todo: list[int],
        done: dict[str, Any],
        *,
        concurrency: int,
        every: int,
    ) -> None:
        pending = iter(todo)
        take = threading.Lock()
        stop = threading.Event()
        out: queue.SimpleQueue[tuple[int, bool, Any] | None] = queue.SimpleQueue()

        def work() -> None:
            try:
                while True:
                    with take:
                        index = None if stop.is_set() else next(pending, None)
                    if index is None:
                        return
                    try:
                        out.put((index, True, fn(items[index])))
                    except BaseException as exc:  # carried to the step's thread and raised there, as it was
                        stop.set()  # at once: no thread takes a new item once one has raised
                        out.put((index, False, exc))
            finally:
                connections.close_all()  # this thread's own connections, if `fn` opened any
                out.put(None)

        threads = [
            threading.Thread(target=work, name=f"{self.run_id}/{self.step}:map-{n}", daemon=True)
            for n in range(min(concurrency, len(todo)))
        ]
        for thread in threads:
            thread.start()
        first: BaseException | None = None
        try:
            alive = len(threads)
            while alive:
                message = out.get()
                if message is None:
                    alive -= 1
                    continue
                index, ok, value = message
                if ok:
                    try:  # checked here, on the step's thread: a result that cannot be stored is the item's error
                        value = json.loads(to_json(value, what=f"the result of item {index} of {self.step}'s map"))
                    except ResultNotJSON as exc:
                        ok, value = False, exc
                if not ok:
                    if first is None:
                        first = value
                        stop.set()  # no new item starts; those in flight finish and are kept
                    continue
                done[str(index)] = value
                self._unsaved += 1
                faults.reached(f"map:{len(done)}", self.step)
                if self._unsaved >= every and first is None and len(done) < len(items):
                    self._save(self._loop_cursor)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        if first is not None:
            self.flush()
            raise first

    def flush(self) -> None:
        """Commit the map results collected since the last checkpoint, and the progress report still held (the
        engine calls it when a step raises)."""
        if self._unsaved:
            self._save(self._loop_cursor)
        self._reports.flush()

    def report_held(self) -> None:
        """Commit the progress report still held, if any (the engine calls it when the step returns)."""
        self._reports.flush()

    def _save(self, loop_cursor: int) -> None:
        """Commit the loop position, the step's progress and the maps' results, as one checkpoint."""
        self._loop_cursor = loop_cursor
        if self._checkpoint is None:
            return
        progress = dict(self.progress)
        if self._maps:
            progress[MAP_KEY] = self._maps
        self._checkpoint(loop_cursor, progress)
        self._unsaved = 0
