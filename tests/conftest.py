"""Fixtures shared by the suite: far-system ledgers in a temporary folder, and worker subprocesses."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from glob import glob
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from hypothesis import settings as hypothesis_settings

import tests.workflows  # noqa: F401  (registers the test workflows in this process)
from durableruns import schedules
from project.purchasing.far import FarSystems, systems

ROOT = Path(__file__).resolve().parent.parent

# The demo site's nightly reconciliation (project/purchasing/orders.py) is left out of the suite: a worker would
# start its run when a test happens to cross 02:00 in Amsterdam. Left out of the worker processes the tests start
# (their environment is this one) and of this process; tests/faults/test_demo.py runs the demo with it.
os.environ["PURCHASING_RECONCILIATION_CRON"] = ""
schedules._declared.pop("nightly_reconciliation", None)

# Property tests time nothing: bin/test runs lanes side by side, and a loaded core must not fail an example for
# taking longer than hypothesis' default 200 ms.
hypothesis_settings.register_profile("durableruns", deadline=None)
hypothesis_settings.load_profile("durableruns")


def pytest_configure(config: pytest.Config) -> None:
    """What the next Django releases remove fails the suite, on whichever Django runs it: on 5.2 what 6.0 and 6.1
    remove, on 6.x what 7.0 removes: each RemovedInDjangoNNWarning class the running Django defines."""
    from django.utils import deprecation

    for name in sorted(vars(deprecation)):
        if re.fullmatch(r"RemovedInDjango\d+Warning", name):
            config.addinivalue_line("filterwarnings", f"error::django.utils.deprecation.{name}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `postgres` need row locks and real concurrency: on SQLite they are reported, not run."""
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        return
    reason = pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL=postgres://...)")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(reason)


# The Citus lane (python -m tests.citus.lane): DATABASE_URL names the coordinator of a private cluster whose
# database was migrated and laid out by distribute_runs before pytest started. Citus knows its nodes per database,
# so the tests use that database as it is rather than a test database made beside it (which would hold no
# distributed table); transactional tests empty it after each test, as they empty the test database elsewhere.
CITUS_LANE = os.environ.get("DURABLERUNS_TEST_CITUS") == "1"

if CITUS_LANE:

    @pytest.fixture(scope="session")
    def django_db_setup(django_db_blocker: Any) -> None:
        from durableruns.distribution import is_distributed

        with django_db_blocker.unblock():
            assert is_distributed("default"), "DURABLERUNS_TEST_CITUS=1 needs a record laid out by distribute_runs"


@pytest.fixture
def far(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FarSystems:
    """The far systems, with ledgers in this test's own folder (worker subprocesses inherit FAR_DIR)."""
    monkeypatch.setenv("FAR_DIR", str(tmp_path / "far"))
    return systems()


def database_url() -> str:
    """The test database as a DATABASE_URL, so worker subprocesses write where the test reads."""
    s = connection.settings_dict
    if connection.vendor == "postgresql":
        return f"postgres://{s['USER'] or 'postgres'}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    return f"sqlite:///{s['NAME']}"


# Debian's faketime package (bin/setup --services installs it): preloaded, it shifts a process's wall clock.
LIBFAKETIME = next(iter(sorted(glob("/usr/lib/*/faketime/libfaketime.so.1"))), None)


class Workers:
    """Start `manage.py resume_runs` in real processes; kill them however a test needs."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    @staticmethod
    def skewed(offset: str) -> dict[str, str]:
        """The environment that runs a process with its wall clock `offset` off ("+120s", "-30s"), as a host whose
        clock is wrong: time.time() and datetime.now() are shifted, time.monotonic() is left true (durations
        inside one process stay right), and the shift is relative, so the skewed clock still advances.

        Pass it to start()/spawn() as `**Workers.skewed("+120s")`.
        """
        if LIBFAKETIME is None:
            raise AssertionError("libfaketime.so.1 is missing: `bin/setup --services` installs Debian's faketime")
        # tests/faketime/sitecustomize.py mends time.sleep, which libfaketime breaks with a true monotonic clock.
        path = os.pathsep.join(p for p in (str(ROOT / "tests" / "faketime"), os.environ.get("PYTHONPATH")) if p)
        return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": offset, "PYTHONPATH": path,
                # Both spellings: libfaketime 0.9.10 reads the second, older ones the first.
                "DONT_FAKE_MONOTONIC": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}

    def start_skewed(self, offset: str, *args: str, **extra: str) -> subprocess.Popen[str]:
        """Start a worker whose host clock is `offset` off (see skewed())."""
        return self.start(*args, **self.skewed(offset), **extra)

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(DATABASE_URL=database_url(), DURABLERUNS_WORKFLOW_MODULES="tests.workflows",
                   DJANGO_SETTINGS_MODULE="project.settings", PYTHONUNBUFFERED="1")
        env.update(extra)
        return env

    def start(self, *args: str, **extra: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "resume_runs", "--skip-checks", *args],
            cwd=ROOT, env=self.env(**extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.procs.append(proc)
        return proc

    def run(self, *args: str, timeout: float = 60, **extra: str) -> subprocess.CompletedProcess[str]:
        """Run one worker to its end and return what it printed."""
        proc = self.start(*args, **extra)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.communicate()


@pytest.fixture
def workers() -> Iterator[Workers]:
    pool = Workers()
    yield pool
    pool.stop_all()


def wait_until(predicate, *, timeout: float = 20.0, every: float = 0.05, what: str = "condition") -> None:
    """Poll `predicate` until true; fail the test with `what` after `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
