"""bin/setup, run for real in a copy of the checkout, with stand-ins for the interpreter and PostgreSQL's tools on
PATH (each records how it was called): the demo's virtualenv gets the demo extra and Django alone (no type checker,
no stubs), and a PostgreSQL that asks for a password is left as it is, with what to do said, unless
DURABLERUNS_TRUST_LOOPBACK=1."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.conftest import ROOT

RECORDER = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >>"{log}"
{body}
"""


def tool(where: Path, name: str, log: Path, body: str = "exit 0") -> None:
    path = where / name
    path.write_text(RECORDER.format(log=log, body=body))
    path.chmod(0o755)


def checkout(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A copy of what bin/setup reads, a .venv whose python records its calls, and fake PostgreSQL tools."""
    home = tmp_path / "checkout"
    (home / "bin").mkdir(parents=True)
    shutil.copy(ROOT / "bin" / "setup", home / "bin" / "setup")
    shutil.copy(ROOT / "pyproject.toml", home / "pyproject.toml")
    log = tmp_path / "calls.log"
    log.touch()
    (home / ".venv" / "bin").mkdir(parents=True)
    tool(home / ".venv" / "bin", "python", log)
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    tool(fakes, "pg_ctlcluster", log)
    tool(fakes, "pg_isready", log)
    tool(fakes, "psql", log, body="exit 2")  # the server asks for a password
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DURABLERUNS_TRUST_LOOPBACK")}
    env["PATH"] = f"{fakes}:{env['PATH']}"
    return home, log, env


def test_the_demos_setup_installs_the_demo_extra_and_django_only(tmp_path: Path):
    home, log, env = checkout(tmp_path)
    done = subprocess.run(["bin/setup"], cwd=home, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    installs = [line for line in log.read_text().splitlines() if " install " in line and "--upgrade pip" not in line]
    assert installs == ["python -m pip install --quiet -e .[demo] Django>=5.2,<5.3"]
    assert "psql" not in log.read_text()  # the demo touches no PostgreSQL


def test_a_postgresql_that_asks_for_a_password_is_left_alone_without_the_opt_in(tmp_path: Path):
    home, log, env = checkout(tmp_path)
    refused = subprocess.run(["bin/setup", "--bench"], cwd=home, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1
    assert "asks the postgres user for a password" in refused.stderr
    assert "DURABLERUNS_TRUST_LOOPBACK=1 bin/setup --services" in refused.stderr
    assert "reload" not in log.read_text()  # pg_ctlcluster was never asked to reload: pg_hba.conf unchanged
    chosen = subprocess.run(
        ["bin/setup", "--bench"],
        cwd=home,
        env=dict(env, DATABASE_URL="postgres://me:secret@127.0.0.1:5432/durableruns"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert chosen.returncode == 0, chosen.stderr  # a server of the caller's choosing is not checked here


def test_ci_opts_in_to_trust_on_loopback():
    assert "export DURABLERUNS_TRUST_LOOPBACK=1" in (ROOT / ".ci" / "run").read_text()
