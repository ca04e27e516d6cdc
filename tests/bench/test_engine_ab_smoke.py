"""bench.engine_ab runs end to end at a tiny size against another checkout (this commit, unpacked elsewhere): each
side's processes import their own checkout's durableruns, and the figures it prints hang together; no timing is
asserted."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.postgres

LINE = re.compile(r"none: ([\d.]+) ms per run against ([\d.]+); this / baseline ([\d.]+) \(pairs ([\d.]+)-([\d.]+), "
                  r"2 pairs\)")


def test_this_checkout_against_another_each_side_running_its_own_code(tmp_path):
    base = tmp_path / "other-checkout"
    base.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
    command = [sys.executable, "-m", "bench.engine_ab", "--baseline", str(base), "--pairs", "2", "--runs", "5",
               "--warmup", "2", "--declared", "none", "--db", "dr_bench_engine_smoke"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    figures, imported = proc.stdout.strip().splitlines()[-2:]
    found = LINE.fullmatch(figures)
    assert found is not None, figures
    ours, theirs, ratio, low, high = (float(x) for x in found.groups())
    assert ours > 0 and theirs > 0 and low <= ratio <= high
    assert imported == (f"this: {ROOT.resolve() / 'durableruns' / '__init__.py'}; "
                        f"baseline: {base.resolve() / 'durableruns' / '__init__.py'}")
