"""The last frames of what a step raised, as its attempt records them (`error_detail`), bounded in size.

The error itself (`error`) is the exception's own line (durableruns.passes.describe); this is where it came from:
file, line and function of the innermost frames, and the code on each line, so staff can see where to look.
"""

from __future__ import annotations

import traceback

from durableruns.encoding import storable

FRAMES = 8  # the innermost frames kept
LIMIT = 4000  # characters kept, at most


def error_detail(exc: BaseException) -> str:
    """The traceback of `exc`, its last FRAMES frames and its exception line (chained causes left out), cut to
    LIMIT characters from the end (the innermost frame matters most)."""
    frames = traceback.extract_tb(exc.__traceback__)[-FRAMES:]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)]
    lines.extend(traceback.format_exception_only(type(exc), exc))
    text = "".join(lines).rstrip()
    if len(text) > LIMIT:
        text = "...\n" + text[-(LIMIT - 4) :]
    return storable(text, limit=LIMIT)
