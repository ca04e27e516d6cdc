"""psycopg caches how it parses a statement's %(name)s placeholders only up to its MAX_CACHED_STATEMENT_LENGTH
(4,096 bytes): a longer one is parsed again at every execution, on the hot path at every claim and every step.
The claims a deploy without concurrency limits sends (every variant) and the statements that record a step stay
under it as the hot path sends them (store.sql.compact). A deploy with limits sends a longer claim, which pays
that parse (about 5.2 KB)."""

from __future__ import annotations

import pytest
from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

from durableruns.store import attempts, claims
from durableruns.store.sql import compact

HOT = {
    **{f"claim {key}": text for key, text in claims.CLAIMS.items()},
    **{f"result {key}": text for key, text in attempts._RECORD_RESULT.items()},
    **{f"held results {key}": text for key, text in attempts._RECORD_UNRECORDED.items()},
    "intent": attempts._RECORD_INTENT,
}


@pytest.mark.parametrize("name", sorted(HOT))
def test_a_hot_statement_is_short_enough_for_psycopg_to_cache_its_parsing(name):
    sent = compact(HOT[name]).encode()
    assert len(sent) <= MAX_CACHED_STATEMENT_LENGTH, f"{name}: {len(sent)} bytes"
