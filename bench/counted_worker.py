"""`manage.py` with psycopg's statements and round trips counted, for bench.commit_limit's breakdown.

    BENCH_COUNTS_FILE=/tmp/counts.json python -m bench.counted_worker resume_runs --once --concurrency 8

Before Django starts, psycopg's Cursor.execute/executemany, Connection.commit/rollback and Connection.pipeline
are wrapped: every statement sent counts as one; a statement outside a pipeline, a commit or a rollback is one
round trip, and a whole pipeline block is one (psycopg syncs it once, when the block ends). At exit the counts go
to BENCH_COUNTS_FILE as JSON. The counting costs a little Python per statement, so the commit-limit benchmark
takes its timed rounds with plain `manage.py` and runs this only in a separate, untimed pass.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

COUNTS = {"statements": 0, "round_trips": 0, "pipelines": 0, "commits": 0}
_lock = threading.Lock()
_local = threading.local()


def _count(**by: int) -> None:
    with _lock:
        for name, n in by.items():
            COUNTS[name] += n


def install() -> None:
    """Wrap psycopg's sending methods so that each counts what it sends."""
    import psycopg

    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany
    commit, rollback, pipeline = psycopg.Connection.commit, psycopg.Connection.rollback, psycopg.Connection.pipeline

    def counted_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        _count(statements=1, round_trips=0 if getattr(_local, "pipeline", 0) else 1)
        return execute(self, *args, **kwargs)

    def counted_executemany(self: Any, query: Any, params_seq: Any, **kwargs: Any) -> Any:
        params_seq = list(params_seq)
        _count(statements=len(params_seq), round_trips=0 if getattr(_local, "pipeline", 0) else 1)
        return executemany(self, query, params_seq, **kwargs)

    def counted_commit(self: Any) -> Any:
        _count(round_trips=1, commits=1)
        return commit(self)

    def counted_rollback(self: Any) -> Any:
        _count(round_trips=1)
        return rollback(self)

    @contextmanager
    def counted_pipeline(self: Any) -> Iterator[Any]:
        _local.pipeline = getattr(_local, "pipeline", 0) + 1
        try:
            with pipeline(self) as block:
                yield block
        finally:
            _local.pipeline -= 1
            if not _local.pipeline:
                _count(round_trips=1, pipelines=1)

    psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign]
    psycopg.Cursor.executemany = counted_executemany  # type: ignore[method-assign]
    psycopg.Connection.commit = counted_commit  # type: ignore[method-assign]
    psycopg.Connection.rollback = counted_rollback  # type: ignore[method-assign]
    psycopg.Connection.pipeline = counted_pipeline  # type: ignore[method-assign,assignment]


def _write(path: str) -> None:
    with _lock:
        data = dict(COUNTS)
    with open(path, "w") as out:
        json.dump(data, out)


def main() -> None:
    path = os.environ["BENCH_COUNTS_FILE"]
    install()
    atexit.register(_write, path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *sys.argv[1:]])


if __name__ == "__main__":
    main()
