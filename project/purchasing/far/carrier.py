"""Simulated shipping carrier: every ``book`` call books a new shipment, with no deduplication.

Its ``lookup`` by our key is strongly consistent, so a resumed run can check whether the
shipment was already booked before booking again; the ledger counts any double booking.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from .config import CarrierConfig, FarConfig
from .ledger import Effect, FarSystem, encode_payload, require_key


class Carrier(FarSystem[CarrierConfig]):
    """Books shipments keyed by the caller's key; repeats create further shipments."""

    name = "carrier"

    @staticmethod
    def _select_config(loaded: FarConfig) -> CarrierConfig:
        return loaded.carrier

    @staticmethod
    def _shipment(effect: Effect) -> dict[str, Any]:
        payload = effect["payload"]
        return {
            "shipment_id": f"sh_{effect['id']}",
            "key": effect["key"],
            "address": payload["address"],
            "parcels": payload["parcels"],
        }

    def book(
        self, *, key: str, address: Mapping[str, Any] | str, parcels: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any]:
        """Book a shipment (even if one with this key exists) and return it."""
        require_key("key", key)
        payload = encode_payload({"address": address, "parcels": parcels})

        def write(conn: sqlite3.Connection) -> dict[str, Any]:
            return self._shipment(self._insert(conn, key=key, payload=payload))

        return self._perform("book", write)

    def lookup(self, key: str) -> dict[str, Any] | None:
        """The first shipment booked with ``key``; sees every committed booking immediately."""
        self._delay()
        with self._reading() as conn:
            effect = self._first_effect(conn, key)
        return None if effect is None else self._shipment(effect)
