"""The mistake the design source starts from, decided in isolation: after a crash that followed the portal's
acceptance, asking its lagging search orders again; looking the order up by our own key does not.

This is the decision the demo shows with real processes (tests/faults/test_demo.py); here it is pinned down
without timing: the replica's lag is seeded, and the question is asked both before and after it has passed.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from project.purchasing import naive, workflows
from project.purchasing.far import PortalConfig, SupplierPortal


LAGGING = 2  # seeds of the portal's replica lag (up to 5 s): 4.7 s for its first order
PROMPT = 15  # 0.06 s


def test_a_search_right_after_the_crash_orders_again_a_lookup_by_key_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAR_DIR", str(tmp_path))  # where purchase_order's lookup asks
    portal = SupplierPortal(PortalConfig(search_lag_max=5.0, seed=LAGGING), tmp_path)
    accepted = naive.place(portal, "PO-2026-0041")  # the portal accepted; then the worker died
    assert portal.effects()[0]["lag"] > 4
    key = accepted["key"]

    # The naive resume asks the replica, which has not caught up: it orders a second time.
    again, submitted = naive.resume(portal, "PO-2026-0041")
    assert submitted and again["order_id"] != accepted["order_id"]
    assert portal.duplicates() == {key: 2}

    # durableruns' resume asks the portal for the order by our own key: the first order, at once.
    found = workflows.purchase_order["place_order"].lookup(SimpleNamespace(effect_key=key))
    assert found == accepted


def test_once_the_replica_has_caught_up_the_search_finds_the_order(tmp_path: Path) -> None:
    portal = SupplierPortal(PortalConfig(search_lag_max=5.0, seed=PROMPT), tmp_path)
    accepted = naive.place(portal, "PO-2026-0042")
    time.sleep(portal.effects()[0]["lag"] + 0.05)  # past the replica's lag: now the answer is right
    order, submitted = naive.resume(portal, "PO-2026-0042")
    assert not submitted and order == accepted
    assert portal.count() == 1
