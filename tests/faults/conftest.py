"""Fixtures of the fault tests, and the summary they leave in pytest's output (even without -s).

The crash matrix and the soak add their counts (cases, kills, runs, effects, duplicates) with `fault_report`;
`pytest_terminal_summary` prints the totals in a section of its own at the end of the run, so CI's log shows
them whatever the capture mode.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from django.db import connection

from tests.faults.pgbouncer import PgBouncer, pgbouncer

# Totals per title ("crash matrix", "soak"), summed over the tests that reported them.
FAULT_COUNTS: dict[str, dict[str, int]] = {}

Report = Callable[[str, dict[str, int]], None]


@pytest.fixture
def fault_report(record_property: Callable[[str, object], None]) -> Report:
    """Report a test's counts: printed now (seen with -s), totalled in the terminal summary, and in junit."""

    def report(title: str, counts: dict[str, int]) -> None:
        print(f"{title}: " + ", ".join(f"{n} {name}" for name, n in counts.items()))
        totals = FAULT_COUNTS.setdefault(title, {})
        for name, n in counts.items():
            totals[name] = totals.get(name, 0) + n
            record_property(name, n)

    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FAULT_COUNTS:
        terminalreporter.section("durableruns under faults")
        for title, totals in FAULT_COUNTS.items():
            terminalreporter.write_line(f"{title}: " + ", ".join(f"{n} {name}" for name, n in totals.items()))


@pytest.fixture
def bouncer() -> Iterator[PgBouncer]:
    """PgBouncer in transaction pooling in front of this test's database, with 3 server connections."""
    s = connection.settings_dict
    with pgbouncer(host=s["HOST"] or "127.0.0.1", port=int(s["PORT"] or 5432), database=s["NAME"]) as running:
        yield running
