"""The crash matrix reads its probe log while other doomed workers still append to it: a line seen half copied
(no newline yet) is left for the next read, never parsed (it once failed a CI run with a ValueError)."""

from __future__ import annotations

from pathlib import Path

from tests.faults.support import Probe


def test_a_last_line_without_its_newline_is_left_for_the_next_read(tmp_path: Path) -> None:
    log = tmp_path / "probe.log"
    log.write_text("11.1 claim run-a\n11.1 before_intent charge\n12.1 after_re")
    assert Probe(log).events() == [("11.1", "claim", "run-a"), ("11.1", "before_intent", "charge")]
    assert Probe(log).last_point(11) == ("before_intent", "charge")
    with log.open("a") as rest:
        rest.write("turn notify_buyer\n")
    assert Probe(log).last_point(12) == ("after_return", "notify_buyer")
    log.write_text("")
    assert Probe(log).events() == []
