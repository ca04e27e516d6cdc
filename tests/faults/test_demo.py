"""The demo runs in CI: `manage.py demo` on a SQLite file of its own, checked against what it prints and against
the record and the far systems' ledgers it leaves behind."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from project.purchasing.far import systems
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

RUN_IDS = [f"PO-2026-{n:04d}" for n in range(41, 46)]


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_demo_kills_resumes_and_ends_with_no_duplicates_while_the_naive_resume_has_some(tmp_path: Path) -> None:
    database = tmp_path / "demo.sqlite3"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DURABLERUNS_", "FAR_", "PURCHASING_"))}
    env.update(DATABASE_URL=f"sqlite:///{database}", FAR_DIR=str(tmp_path / "far"),
               DJANGO_SETTINGS_MODULE="project.settings")
    migrated = manage("migrate", "--skip-checks", "-v0", env=env)
    assert migrated.returncode == 0, migrated.stderr

    demo = manage("demo", env=env)
    out = demo.stdout
    assert demo.returncode == 0, out + demo.stderr
    assert "Traceback" not in out + demo.stderr and demo.stderr == "", demo.stderr

    # The kills, and the sentences read off the record right after them.
    assert "PO-2026-0041: killed by the demo while pricing its 240 lines" in out
    assert "PO-2026-0043: died just after the supplier portal accepted the order" in out
    assert re.search(r"PO-2026-0041  1 step complete, quote in doubt since \d\d:\d\d, 7 steps remaining", out)
    assert re.search(r"PO-2026-0044  7 steps complete, notify_buyer in doubt since", out)

    # The resume, by resume_runs' own lines; every run completed or in the escalation queue.
    assert "3. Resume: manage.py resume_runs" in out and "PO-2026-0043: completed - all 8 steps complete" in out
    assert "PO-2026-0044: needs_decision - notify_buyer is in doubt" in out
    section = out.split("Where every run ended:\n", 1)[1].split("\n\n", 1)[0]
    ended = dict(re.findall(r"^   (PO-2026-\d{4})  (\w+) ", section, re.M))
    assert ended == {**{r: "completed" for r in RUN_IDS}, "PO-2026-0044": "needs_decision"}, ended
    assert "The escalation queue (1 waiting for a person)" in out
    assert re.search(r"Meanwhile it holds: reserve_stock \(rs_\d+\) since \d\d:\d\d:\d\d, lapses in 3 h 5\d min", out)

    # The order abandoned in the queue gives its stock back, through a worker, once.
    assert re.search(r"In the queue: PO-2026-0049 notify_buyer; it holds reserve_stock \(rs_\d+\)", out), out
    assert "Staff abandon it: the run is now pending, ending as cancelled." in out
    assert "PO-2026-0049: cancelled - gave back reserve_stock before ending" in out
    assert re.search(r"reservation rs_\d+ given back as rl_\d+ under the release's own key "
                     r"PO-2026-0049:reserve_stock:release", out), out
    assert re.search(r"reservations held: 5 \(by orders that completed or still wait\), released: 1 .*leaked: 0", out)

    # The counts it prints: none for durableruns, some for the naive resume.
    assert "   duplicates: 0" in out
    naive = re.search(r"naive resume \(search, then submit\) +(\d+) +(\d+)", out)
    ours = re.search(r"durableruns \(look up by our own key\) +(\d+) +(\d+)", out)
    assert naive and ours, out
    assert int(naive.group(2)) > 0 and int(naive.group(1)) == 3 + int(naive.group(2))
    assert (int(ours.group(1)), int(ours.group(2))) == (3, 0)

    # The second act: orders that wait for a manager and the supplier, fan out, and a nightly schedule.
    act = out.split("8. Orders as they really run", 1)[1].split("\n9. Look around", 1)[0]
    assert re.search(r"240 portal calls of 20 ms, 16 at a time \(ctx.map\), took 0\.\d\d s", act), act
    assert re.search(r"PO-2026-0101  waiting  2 steps complete, waiting for approval manager_approval since "
                     r"\d\d:\d\d \(times out \d{4}-\d\d-\d\d \d\d:\d\d\), 7 steps remaining", act), act
    assert re.search(r"PO-2026-0102  waiting  5 steps complete, waiting for supplier_confirmed since", act), act
    assert "Leases they held: 0." in act
    assert re.search(r"the charge's intent was recorded \d+\.\d\d s after the decision", act), act
    assert "PO-2026-0101 key sup-msg-88121 {'confirmation': 'SUP-88121', 'backorder': False}: 201 recorded" in act
    assert "PO-2026-0101 key sup-msg-88121 {'confirmation': 'SUP-88121', 'backorder': False}: 200 a retry" in act
    assert "PO-2026-0101  completed all 9 steps complete" in act and "PO-2026-0102  completed all 9 steps" in act
    assert "so its notify_buyer is skipped" in act
    assert "The carrier's ledger: 3 bookings under 3 keys; the payment provider: 2 charges under 2 keys." in act
    assert re.search(r"schedule nightly_reconciliation \('0 2 \* \* \*' in Europe/Amsterdam\), first\n   seen by a "
                     r"worker at \d\d:\d\d:\d\d\. Its next slot is \d{4}-\d\d-\d\d 02:00 Europe/Amsterdam", act), act
    assert re.search(r"nightly_reconciliation@\d{4}-\d\d-\d\dT0[01]:00:00Z, which the database takes once", act), act

    # What it left behind says the same: the record...
    with sqlite3.connect(database) as db:
        status = dict(db.execute("SELECT run_id, status FROM run_state"))
        open_escalations = db.execute(
            "SELECT e.run_id, e.step FROM run_escalation e LEFT JOIN run_intervention i ON i.escalation_id = e.id "
            "WHERE i.id IS NULL").fetchall()
        decisions = db.execute("SELECT run_id, action, decided_by FROM run_intervention ORDER BY id").fetchall()
        events = db.execute("SELECT run_id, key, consumed_step FROM run_event ORDER BY id").fetchall()
        parents = dict(db.execute("SELECT run_id, parent_id FROM run_state WHERE parent_id IS NOT NULL"))
        schedules = db.execute("SELECT name, last_slot FROM run_schedule").fetchall()
    shipments = [f"PO-2026-0101/book_shipments/{w}" for w in ("Antwerp", "Hamburg", "Rotterdam")]
    shipments.append("PO-2026-0102/book_shipments/Hamburg")
    assert status == {**{r: "completed" for r in RUN_IDS + ["PO-2026-0046", "PO-2026-0047", "PO-2026-0048"]},
                      "PO-2026-0044": "needs_decision", "PO-2026-0049": "cancelled",
                      **{r: "completed" for r in ["PO-2026-0101", "PO-2026-0102", *shipments]}}
    assert decisions == [("PO-2026-0049", "abandon", "demo staff"), ("PO-2026-0101", "approve", "manager")]
    assert events == [("PO-2026-0101", "sup-msg-88121", "supplier_confirmed"),
                      ("PO-2026-0102", "sup-msg-88122", "supplier_confirmed")]
    assert parents == {child: child.split("/")[0] for child in shipments}
    assert schedules == [("nightly_reconciliation", None)]
    assert open_escalations == [("PO-2026-0044", "notify_buyer")]
    # ...and the ledgers: one effect per key for durableruns, duplicate orders at the naive portal.
    far = systems(directory=tmp_path / "far")
    # the abandoned order got as far as shipping; the second act's two orders charge and order, and the first of
    # them books three shipments, the second one (none asks the credit vendor)
    for name, keys in (("portal", 11), ("credit", 9), ("payments", 11), ("carrier", 13)):
        assert getattr(far, name).duplicates() == {}, name
        assert len(getattr(far, name).counts_by_key()) == keys, name
    assert far.warehouse.duplicates() == {}
    assert [r["key"] for r in far.warehouse.releases()] == ["PO-2026-0049:reserve_stock:release"]
    first_act = set(RUN_IDS + ["PO-2026-0046", "PO-2026-0047", "PO-2026-0048"])
    assert {r["key"] for r in far.warehouse.held()} == {f"{r}:reserve_stock" for r in first_act}
    assert systems(directory=tmp_path / "far" / "naive").portal.duplicates() != {}
