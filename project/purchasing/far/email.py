"""Simulated email sender: records every message sent, with no key and no way to look one up.

Like real SMTP it cannot tell a caller whether an earlier send went through, so a run must
record its own intent to notify; the ledger shows how many messages actually went out.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from .config import EmailConfig, FarConfig
from .ledger import Effect, FarSystem, encode_payload, require_key


class EmailSender(FarSystem[EmailConfig]):
    """Sends email; each ``send`` is one more message in the ledger (stored with key NULL)."""

    name = "email"

    @staticmethod
    def _select_config(loaded: FarConfig) -> EmailConfig:
        return loaded.email

    @staticmethod
    def _message(effect: Effect) -> dict[str, Any]:
        payload = effect["payload"]
        return {
            "message_id": f"msg_{effect['id']}",
            "to": payload["to"],
            "subject": payload["subject"],
            "body": payload["body"],
        }

    def send(self, *, to: str, subject: str, body: str) -> dict[str, Any]:
        """Send one message and return it."""
        require_key("to", to)
        payload = encode_payload({"to": to, "subject": subject, "body": body})

        def write(conn: sqlite3.Connection) -> dict[str, Any]:
            return self._message(self._insert(conn, key=None, payload=payload))

        return self._perform("send", write)
