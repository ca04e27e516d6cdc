"""What the install tests share: the wheel, built once from this checkout as an index would build it, and fresh
virtualenvs with it installed (one per set of extras), reused by every test of tests/install."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from the sdist as an index would build it, with no setuptools warning about packages."""
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], capture_output=True, text=True, timeout=300
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert "absent from the `packages` configuration" not in built.stdout + built.stderr
    [whl] = out.glob("durableruns-*.whl")
    return whl


@pytest.fixture(scope="session")
def venvs(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Path]]:
    """Fresh virtualenvs (no system site-packages), each with the wheel and the extras named, from the index: one
    per set of extras, made when a test first asks for it."""
    made: dict[str, Path] = {}

    def venv(extras: str) -> Path:
        if extras not in made:
            home = tmp_path_factory.mktemp("venv") / "venv"
            subprocess.run([sys.executable, "-m", "venv", str(home)], check=True, timeout=120)
            installed = subprocess.run(
                [str(home / "bin" / "pip"), "install", "--quiet", f"{wheel}{extras}"],
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert installed.returncode == 0, installed.stderr
            made[extras] = home
        return made[extras]

    yield venv
