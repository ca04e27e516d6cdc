"""SQLite with Django's default OPTIONS, as a site that copied nothing from the demo has it: one `--loop`
worker and several processes calling start() at once share the file without "database is locked".

Django's defaults (DEFERRED transactions, rollback journal) make SQLite refuse a read-then-write transaction at
once when another writer holds the file; durableruns sets up its connections itself (durableruns/sqlite.py).
The test makes its own SQLite file, so it runs whatever database the suite is on.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

from tests.conftest import ROOT, Workers, wait_until

STARTERS = 3
RUNS_EACH = 15

START_MANY = """
import durableruns, sys
prefix, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    durableruns.start("scripted", {}, run_id=f"{prefix}-{i:03d}")
"""


def statuses(db: Path) -> dict[str, int]:
    with sqlite3.connect(db, timeout=30) as raw:
        return dict(raw.execute("SELECT status, COUNT(*) FROM run_state GROUP BY status").fetchall())


def test_a_loop_worker_beside_concurrent_starts_on_default_sqlite_options(tmp_path: Path):
    db = tmp_path / "site.sqlite3"
    pool = Workers()
    env = pool.env(DATABASE_URL=f"sqlite:///{db}")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True, timeout=120)
    try:
        worker = pool.start("--loop", "--interval", "0.05", DATABASE_URL=f"sqlite:///{db}")
        starters = [
            subprocess.Popen(
                [sys.executable, "-c", f"import django; django.setup(); exec({START_MANY!r})", f"s{n}", str(RUNS_EACH)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for n in range(STARTERS)
        ]
        for starter in starters:
            out, err = starter.communicate(timeout=120)
            assert starter.returncode == 0, err
        total = STARTERS * RUNS_EACH
        wait_until(
            lambda: statuses(db).get("completed") == total or worker.poll() is not None,
            timeout=120,
            what=f"{total} runs completed by the worker",
        )
        assert worker.poll() is None, worker.communicate()[1]
        assert statuses(db) == {"completed": total}
    finally:
        pool.stop_all()
    _, err = worker.communicate()
    assert "database is locked" not in err


def test_with_the_set_up_turned_off_a_check_names_the_options_to_set(settings):
    from durableruns.sqlite import check_sqlite_options

    sqlite_db = {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3", "OPTIONS": {"timeout": 20}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Django warns that overriding DATABASES is unusual: only the check reads it
        settings.DATABASES = {"default": sqlite_db}
    assert check_sqlite_options() == []  # durableruns sets its connections up itself
    settings.DURABLERUNS_SQLITE_TUNING = False
    [warning] = check_sqlite_options()
    assert warning.id == "durableruns.W101"
    assert '"transaction_mode": "IMMEDIATE"' in warning.hint and "journal_mode=WAL" in warning.hint
    assert '"timeout"' not in warning.hint  # the site set that one
