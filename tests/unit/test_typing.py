"""The pure core and the only writer are type-checked strictly, as the house style asks."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

STRICT = ["durableruns/boundary.py", "durableruns/policies.py", "durableruns/errors.py", "durableruns/store.py",
          "durableruns/pgsql.py", "durableruns/tradeoff.py"]


def test_core_modules_pass_mypy_strict():
    result = subprocess.run([sys.executable, "-m", "mypy", "--strict", *STRICT], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
