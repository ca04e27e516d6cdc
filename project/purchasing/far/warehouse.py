"""Simulated warehouse: stock reserved for an order under our key, and given back under a key of its own.

A reservation is a hold, not a sale: the warehouse keeps the stock aside for the order until it is released (or
until its own expiry, which the workflow declares as hold_expires_after). Both calls honour their keys (a repeat
returns the first reservation or release and changes nothing), so the ledger can prove one reservation per
order and one release per reservation, and count what is still held: what a run ending unfinished leaked.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from .config import FarConfig, WarehouseConfig
from .ledger import Effect, FarSystem, encode_payload, require_key


class Warehouse(FarSystem[WarehouseConfig]):
    """Reserves and releases stock; at most one effect per key, of either kind."""

    name = "warehouse"
    extra_columns = ("kind TEXT NOT NULL DEFAULT 'reserve'", "reservation TEXT")
    extra_ddl = ("CREATE UNIQUE INDEX IF NOT EXISTS effects_one_per_key ON effects (key)",)

    @staticmethod
    def _select_config(loaded: FarConfig) -> WarehouseConfig:
        return loaded.warehouse

    @staticmethod
    def _reservation(effect: Effect) -> dict[str, Any]:
        return {"reservation_id": f"rs_{effect['id']}", "key": effect["key"], "lines": effect["payload"]["lines"]}

    @staticmethod
    def _release(effect: Effect) -> dict[str, Any]:
        return {"release_id": f"rl_{effect['id']}", "key": effect["key"], "reservation_id": effect["reservation"]}

    def reserve(self, lines: int, *, key: str) -> dict[str, Any]:
        """Set `lines` lines of stock aside under `key`; a repeat returns the first reservation."""
        require_key("key", key)
        payload = encode_payload({"lines": lines})

        def write(conn: sqlite3.Connection) -> dict[str, Any]:
            existing = self._first_effect(conn, key)
            if existing is not None:
                return self._reservation(existing)
            return self._reservation(self._insert(conn, key=key, payload=payload, kind="reserve"))

        return self._perform("reserve", write)

    def release(self, reservation_id: str, *, key: str) -> dict[str, Any]:
        """Give the reservation back under `key` (the release's own); a repeat returns the first release."""
        require_key("key", key)
        require_key("reservation_id", reservation_id)

        def write(conn: sqlite3.Connection) -> dict[str, Any]:
            existing = self._first_effect(conn, key)
            if existing is not None:
                return self._release(existing)
            known = conn.execute(
                "SELECT 1 FROM effects WHERE kind = 'reserve' AND 'rs_' || id = ?", (reservation_id,)
            ).fetchone()
            if known is None:
                raise ValueError(f"no reservation {reservation_id} at the warehouse")
            return self._release(self._insert(conn, key=key, payload="{}", kind="release", reservation=reservation_id))

        return self._perform("release", write)

    def find_reservation(self, key: str) -> dict[str, Any] | None:
        """The reservation made under `key`, if any; strongly consistent."""
        self._delay()
        with self._reading() as conn:
            effect = self._first_effect(conn, key)
        return None if effect is None or effect["kind"] != "reserve" else self._reservation(effect)

    def find_release(self, key: str) -> dict[str, Any] | None:
        """The release made under `key`, if any; strongly consistent."""
        self._delay()
        with self._reading() as conn:
            effect = self._first_effect(conn, key)
        return None if effect is None or effect["kind"] != "release" else self._release(effect)

    def reservations(self) -> list[dict[str, Any]]:
        """Every reservation, with whether it was released (and by which release)."""
        released = {e["reservation"]: e for e in self.effects() if e["kind"] == "release"}
        out = []
        for effect in self.effects():
            if effect["kind"] == "reserve":
                reservation = self._reservation(effect)
                reservation["released"] = reservation["reservation_id"] in released
                out.append(reservation)
        return out

    def held(self) -> list[dict[str, Any]]:
        """Reservations never released: stock the warehouse still keeps aside."""
        return [r for r in self.reservations() if not r["released"]]

    def releases(self) -> list[dict[str, Any]]:
        """Every release, in the order they were made."""
        return [self._release(e) for e in self.effects() if e["kind"] == "release"]
