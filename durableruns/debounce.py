"""What a debounced start asks for (durableruns.start(..., debounce=, key=)), checked before anything is
written: a positive timedelta and a key the record can store. Pure: no Django, no I/O; the start itself is
durableruns.store.debounce."""

from __future__ import annotations

import unicodedata
from datetime import datetime, timedelta

from durableruns.errors import InvalidInput

KEY_LIMIT = 200  # run_state.debounce_key's length
LONGEST = timedelta(days=366)  # a debounce past a year is a mistake, not a burst of edits


def debounce_of(debounce: object, key: object, *, run_after: datetime | None = None) -> tuple[timedelta, str] | None:
    """The (debounce, key) of a debounced start, or None for a start without one; InvalidInput naming what is
    wrong otherwise."""
    if debounce is None and key is None:
        return None
    if debounce is None:
        raise InvalidInput("key= names a debounced start: give debounce= (a timedelta) with it")
    if not isinstance(debounce, timedelta) or debounce <= timedelta(0) or debounce > LONGEST:
        raise InvalidInput(f"debounce must be a positive timedelta of at most {LONGEST.days} days, not {debounce!r}")
    if not isinstance(key, str) or not key.strip() or len(key) > KEY_LIMIT:
        raise InvalidInput(
            f"a debounced start needs key=, a non-empty string of at most {KEY_LIMIT} characters, not {key!r}"
        )
    if "\x00" in key or any(0xD800 <= ord(ch) <= 0xDFFF for ch in key):
        raise InvalidInput(
            f"the debounce key {key!r} holds a NUL character or a lone surrogate, which cannot be stored"
        )
    if any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in key):
        raise InvalidInput(f"the debounce key {key!r} holds a control character, which is refused")
    if run_after is not None:
        raise InvalidInput(
            "a debounced start is due debounce= after the last start with its key: run_after= cannot be given with it"
        )
    return debounce, key
