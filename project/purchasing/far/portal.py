"""Simulated supplier portal: accepts purchase orders and never deduplicates them.

Its ``search`` is served by a lagging read replica, as many real portals are, so "search for my
reference, submit if absent" can still order twice after a crash; ``get_by_key`` is the
strongly consistent lookup that a crash-safe caller has to use instead.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .config import FarConfig, PortalConfig
from .ledger import Effect, FarSystem, encode_payload, require_key


class SupplierPortal(FarSystem[PortalConfig]):
    """Places purchase orders at the supplier; every ``submit_order`` call is a new order."""

    name = "portal"
    extra_columns = ("reference TEXT NOT NULL", "lag REAL NOT NULL")
    extra_ddl = ("CREATE INDEX IF NOT EXISTS effects_reference ON effects (reference, id)",)

    @staticmethod
    def _select_config(loaded: FarConfig) -> PortalConfig:
        return loaded.portal

    @staticmethod
    def _order(effect: Effect) -> dict[str, Any]:
        return {
            "order_id": f"po_{effect['id']}",
            "key": effect["key"],
            "reference": effect["reference"],
            "lines": effect["payload"]["lines"],
        }

    def submit_order(self, *, key: str, reference: str, lines: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Create an order (even if one with this key exists) and return it."""
        require_key("key", key)
        require_key("reference", reference)
        payload = encode_payload({"lines": lines})

        def write(conn: sqlite3.Connection) -> dict[str, Any]:
            # The replica lag is drawn once per order and stored on its row, so whether a
            # given order is visible to search at a given moment is reproducible.
            lag = self._rng.uniform(0.0, self.config.search_lag_max)
            effect = self._insert(conn, key=key, payload=payload, reference=reference, lag=lag)
            return self._order(effect)

        return self._perform("submit_order", write)

    def search(self, reference: str) -> list[dict[str, Any]]:
        """Orders with this reference, as seen by the lagging replica (may miss recent ones)."""
        self._delay()
        rows = self._query(
            "SELECT * FROM effects WHERE reference = ? AND (lag <= 0 OR ? - created_at >= lag) ORDER BY id",
            (reference, time.time()),
        )
        return [self._order(self._effect(row)) for row in rows]

    def get_by_key(self, key: str) -> dict[str, Any] | None:
        """The first order submitted with ``key``; sees every committed order immediately."""
        self._delay()
        with self._reading() as conn:
            effect = self._first_effect(conn, key)
        return None if effect is None else self._order(effect)
