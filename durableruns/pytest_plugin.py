"""durableruns' pytest plugin (registered by the package's pytest11 entry point): the `clock` fixture, a test
clock (durableruns.testing.TestClock) in use for the test and put away after it. A fixture of the same name in
your conftest.py takes precedence."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from durableruns.testing import TestClock


@pytest.fixture
def clock() -> Iterator[TestClock]:
    """A test clock for this test: `clock.advance(timedelta(days=2))` moves every durableruns decision's time, in
    this process and in the workers the test starts after asking for it."""
    with TestClock() as moved:
        yield moved
