"""JSON and text as the record stores them: what PostgreSQL's jsonb and text columns accept, checked before a
write so that a step's result, progress or error never breaks the commit that records it. PURE: no Django.

Below the store, which records them, and the step's context, which checks what a map's items return: each reads
this without the other.
"""

from __future__ import annotations

import json
import re
from typing import Any

from durableruns.errors import ResultNotJSON

_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def to_json(value: Any, *, what: str) -> str:
    """Encode `value` as JSON text PostgreSQL's jsonb can store, or raise ResultNotJSON naming what it was."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")  # a lone surrogate cannot be stored
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise ResultNotJSON(f"{what} is not JSON ({type(value).__name__}): {exc}") from None
    if _NUL.search(text):
        raise ResultNotJSON(f"{what} contains a NUL character (\\u0000), which jsonb cannot store")
    return text


def ensure_json(value: Any, *, what: str) -> Any:
    """Return `value` if it round-trips through JSON, else raise ResultNotJSON naming what it was."""
    to_json(value, what=what)
    return value


# Past this, an error text or a reason is cut (with a marker): a traceback's repr of a huge value must not bloat
# the record or the admin page.
TEXT_LIMIT = 10_000


def storable(text: str, *, limit: int = TEXT_LIMIT) -> str:
    """`text` as PostgreSQL can store it: NUL characters (which no text column holds) and lone surrogates (which
    are not UTF-8) replaced, and cut to `limit` characters with a marker saying how much was cut."""
    text = text.replace("\x00", "\\0")
    text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) > limit:
        text = f"{text[:limit]}... [cut: {len(text) - limit} more characters]"
    return text
