"""Starting a run with a run_id or input the database cannot store: `InvalidInput`, on SQLite as on PostgreSQL.

PostgreSQL refuses a NUL character in text and jsonb, and neither database can encode a lone surrogate as
UTF-8; SQLite stores a NUL in text without a word. Left to the database, the same call would be a DataError on
one backend, a UnicodeEncodeError on both, or a run whose id no worker on the other backend could ever write.
`durableruns.start` says which value is wrong before anything is written, whatever the database.
"""

from __future__ import annotations

from typing import Any

import pytest

import durableruns
from durableruns.errors import InvalidInput
from durableruns.models import RunState

pytestmark = pytest.mark.django_db(transaction=True)

NUL = "\x00"
SURROGATE = "\ud800"  # half of a UTF-16 pair, alone: no UTF-8 encoding exists

BAD_RUN_IDS = {
    "NUL in the run_id": f"po{NUL}41",
    "a lone surrogate in the run_id": f"po{SURROGATE}41",
    "only a NUL": NUL,
}
BAD_INPUTS: dict[str, dict[str, Any]] = {
    "NUL in a value": {"reference": f"PO{NUL}41"},
    "NUL in a key": {f"ref{NUL}": "PO-41"},
    "a lone surrogate in a value": {"reference": f"PO{SURROGATE}41"},
    "a lone surrogate in a key": {f"ref{SURROGATE}": "PO-41"},
    "NUL deep inside": {"lines": [{"sku": "A-1", "notes": ["ok", f"fragile{NUL}"]}]},
    "a lone surrogate as a nested key": {"lines": [{f"sku{SURROGATE}": "A-1"}]},
    "NUL after an escaped backslash": {"path": f"C:\\{NUL}"},
}


@pytest.mark.parametrize("run_id", BAD_RUN_IDS.values(), ids=BAD_RUN_IDS.keys())
def test_a_run_id_the_database_cannot_store_is_invalid_input_and_nothing_is_written(run_id: str) -> None:
    with pytest.raises(InvalidInput, match="run_id"):
        durableruns.start("scripted", {}, run_id=run_id)
    assert not RunState.objects.exists()


@pytest.mark.parametrize("input", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_an_input_the_database_cannot_store_is_invalid_input_and_nothing_is_written(input: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput, match="the input"):
        durableruns.start("scripted", input, run_id="po-41")
    assert not RunState.objects.exists()


def test_text_that_only_looks_like_a_nul_is_stored_as_typed() -> None:
    """A backslash then 'u0000' is six ordinary characters, and any other non-ASCII text is fine."""
    input = {"path": "C:\\u0000", "buyer": "Société Générale 株式会社 🚚", "n": [1, 2.5, None, True]}
    run_id = durableruns.start("scripted", input, run_id="po-42 ✓")
    assert RunState.objects.get(pk=run_id).input == input


CONTROL_RUN_IDS = {
    "a newline": "po\n41",
    "a header injection": "po-41\r\nBcc: someone@example.com",
    "a tab": "po\t41",
    "a terminal escape": "po\x1b[2J41",
    "DEL": "po\x7f41",
    "a C1 control (NEL)": "po\x8541",
    "a line separator": "po\u202841",
}


@pytest.mark.parametrize("run_id", CONTROL_RUN_IDS.values(), ids=CONTROL_RUN_IDS.keys())
def test_a_run_id_with_a_control_character_is_invalid_input_and_nothing_is_written(run_id: str) -> None:
    """A run id goes into alert mail headers, log lines and terminals: a newline would break every alert about
    the run, so it is refused on both databases, as is every other control character."""
    with pytest.raises(InvalidInput, match="run_id .* holds a control character"):
        durableruns.start("scripted", {}, run_id=run_id)
    assert not RunState.objects.exists()
