"""A mail backend for worker processes started by the tests: each message appended as one JSON line (subject,
recipients, the sending process) to the file TEST_MAILBOX names, so a test counts what every process sent."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.core.mail.backends.base import BaseEmailBackend


class EmailBackend(BaseEmailBackend):
    def send_messages(self, email_messages: Sequence[Any]) -> int:
        lines = "".join(
            json.dumps({"subject": m.subject, "to": list(m.to), "body": m.body, "pid": os.getpid()}) + "\n"
            for m in email_messages
        )
        with open(os.environ["TEST_MAILBOX"], "a", encoding="utf-8") as mailbox:  # O_APPEND: whole lines
            mailbox.write(lines)
        return len(email_messages)


def read(path: Path) -> list[dict[str, Any]]:
    """The messages written to the mailbox at `path`, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
