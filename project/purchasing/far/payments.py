"""Simulated payment provider that honours idempotency keys, like real card processors.

A repeated ``charge`` with the same key returns the first charge and moves no money, which is
what makes retrying a charge after a lost reply safe; the ledger proves it (one effect per key).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from .config import FarConfig, PaymentConfig
from .ledger import Effect, FarSystem, encode_payload, require_key


class PaymentProvider(FarSystem[PaymentConfig]):
    """Charges money; at most one charge exists per idempotency key."""

    name = "payments"
    # Backstop for the invariant enforced in charge(): should the locking ever be broken, a
    # second charge for a key fails loudly instead of quietly moving money twice.
    extra_ddl = ("CREATE UNIQUE INDEX IF NOT EXISTS effects_idempotency ON effects (key)",)

    @staticmethod
    def _select_config(loaded: FarConfig) -> PaymentConfig:
        return loaded.payments

    @staticmethod
    def _charge(effect: Effect) -> dict[str, Any]:
        payload = effect["payload"]
        return {
            "charge_id": f"ch_{effect['id']}",
            "idempotency_key": effect["key"],
            "amount": payload["amount"],
            "currency": payload["currency"],
            "status": "succeeded",
        }

    def charge(self, *, amount: int, currency: str, idempotency_key: str) -> dict[str, Any]:
        """Charge once per key; a repeat returns the first charge (even if its amount differs)."""
        require_key("idempotency_key", idempotency_key)
        require_key("currency", currency)
        if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
            raise ValueError(f"amount must be a positive integer (cents), got {amount!r}")
        payload = encode_payload({"amount": amount, "currency": currency})

        def write(conn: sqlite3.Connection) -> dict[str, Any]:
            # Select and insert share one BEGIN IMMEDIATE transaction, which holds the write
            # lock before the SELECT runs: two processes racing on a key are serialised here,
            # and the later one finds the earlier one's row instead of inserting a second.
            existing = self._first_effect(conn, idempotency_key)
            if existing is not None:
                return self._charge(existing)
            return self._charge(self._insert(conn, key=idempotency_key, payload=payload))

        return self._perform("charge", write)

    def lookup(self, idempotency_key: str) -> dict[str, Any] | None:
        """The charge made under ``idempotency_key``, if any; strongly consistent."""
        self._delay()
        with self._reading() as conn:
            effect = self._first_effect(conn, idempotency_key)
        return None if effect is None else self._charge(effect)
