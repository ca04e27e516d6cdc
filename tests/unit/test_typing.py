"""The pure core and the only writer are type-checked strictly, as the house style asks; the whole app under
pyproject's [tool.mypy] (the django-stubs plugin), on whichever Django runs the suite."""

from __future__ import annotations

import subprocess
import sys

import django

from tests.conftest import ROOT

STRICT = ["durableruns/boundary.py", "durableruns/policies.py", "durableruns/errors.py", "durableruns/encoding.py",
          "durableruns/store", "durableruns/tradeoff.py", "durableruns/rates.py", "durableruns/drawing.py"]
# One cache per Django (and so per django-stubs): the two lanes of bin/test do not overwrite each other's.
CACHE = str(ROOT / ".mypy_cache" / f"django-{django.__version__}")


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", CACHE, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_core_modules_pass_mypy_strict():
    result = mypy("--strict", *STRICT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_whole_app_passes_mypy_with_django_stubs():
    result = mypy("durableruns")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues found" in result.stdout
