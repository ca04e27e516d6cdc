"""The life of a worker process's helper threads (listener, watchdog): started once, stopped on the way out."""

from __future__ import annotations

import threading
from typing import Self


class Background:
    """A daemon thread running `_run` until `stop()`; `_stopped` is what `_run` waits on between its turns."""

    thread_name = "durableruns-background"

    def __init__(self) -> None:
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def _run(self) -> None:
        raise TypeError(f"{type(self).__name__} must define _run")
