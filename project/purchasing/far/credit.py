"""Simulated credit vendor: records every credit check and decides it deterministically.

Its ``lookup`` only sees checks older than a fixed lag (a batch-fed reporting store), so a run
resuming after a crash cannot rely on it to find the check it made moments before.
"""

from __future__ import annotations

from typing import Any

from .config import CreditConfig, FarConfig
from .ledger import Effect, FarSystem, encode_payload, require_key

# Credit limit in cents granted to every buyer except the deliberately overdrawn ones.
DEFAULT_CREDIT_LIMIT: int = 1_000_000


def credit_limit(buyer: str) -> int:
    """Deterministic per-buyer limit: 0 if the buyer's name contains "overdrawn"."""
    return 0 if "overdrawn" in buyer.lower() else DEFAULT_CREDIT_LIMIT


class CreditVendor(FarSystem[CreditConfig]):
    """Runs credit checks keyed by the caller's request id; repeats are recorded again."""

    name = "credit"

    @staticmethod
    def _select_config(loaded: FarConfig) -> CreditConfig:
        return loaded.credit

    @staticmethod
    def _result(effect: Effect) -> dict[str, Any]:
        payload = effect["payload"]
        return {
            "check_id": f"cc_{effect['id']}",
            "request_id": effect["key"],
            "buyer": payload["buyer"],
            "amount": payload["amount"],
            "approved": payload["approved"],
            "limit": payload["limit"],
        }

    def check(self, *, request_id: str, buyer: str, amount: int) -> dict[str, Any]:
        """Record a check (no deduplication) and return its decision."""
        require_key("request_id", request_id)
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
            raise ValueError(f"amount must be a non-negative integer (cents), got {amount!r}")
        limit = credit_limit(buyer)
        payload = encode_payload({"buyer": buyer, "amount": amount, "approved": amount <= limit, "limit": limit})
        return self._perform(
            "check",
            lambda conn: self._result(self._insert(conn, key=request_id, payload=payload)),
        )

    def lookup(self, request_id: str) -> dict[str, Any] | None:
        """The first check for ``request_id`` that is at least ``lookup_lag`` seconds old."""
        self._delay()
        with self._reading() as conn:
            effect = self._first_effect(conn, request_id, visible_after=self.config.lookup_lag)
        return None if effect is None else self._result(effect)
