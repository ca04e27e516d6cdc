"""The deadline's words (issue 32): the boundary's sentence names it while the run has not ended, and the reason
says its span in the largest units."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from durableruns.boundary import compute_boundary
from durableruns.deadlines import reason, span_text
from durableruns.store import Overdue

AT = datetime(2026, 12, 7, 14, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("span", "text"),
    [
        (timedelta(days=3), "3 days"),
        (timedelta(days=1, hours=2, minutes=5), "1 day 2 hours"),
        (timedelta(hours=1, minutes=30), "1 hour 30 minutes"),
        (timedelta(seconds=2), "2 seconds"),
        (timedelta(seconds=2, microseconds=400_000), "2 seconds"),
        (timedelta(minutes=1, seconds=1), "1 minute 1 second"),
        (timedelta(0), "0 seconds"),
    ],
)
def test_a_span_in_words(span, text):
    assert span_text(span) == text


def test_the_reason_names_the_span_and_the_moment_in_utc():
    overdue = Overdue(run_id="r", created_at=AT - timedelta(days=3), deadline_at=AT, on_deadline="cancel")
    assert reason(overdue) == "deadline of 3 days passed at 2026-12-07 14:00:00 UTC"
    shifted = replace(overdue, deadline_at=AT.astimezone(timezone(timedelta(hours=2))))
    assert reason(shifted) == reason(overdue)


@pytest.mark.parametrize(
    ("status", "named"),
    [
        (None, True),
        ("pending", True),
        ("waiting", True),
        ("needs_decision", True),
        ("completed", False),
        ("failed", False),
        ("cancelled", False),
    ],
)
def test_the_sentence_names_the_deadline_while_the_run_has_not_ended(status, named):
    b = replace(compute_boundary(("a", "b"), ()), status=status, deadline=AT)
    assert b.sentence().endswith(", deadline 2026-12-07 14:00 UTC") is named
    assert ("deadline" in b.sentence()) is named


def test_the_sentence_without_a_deadline_is_as_before():
    b = compute_boundary(("a", "b"), ())
    assert b.sentence() == "0 steps complete, 2 steps remaining"
    assert replace(b, deadline=AT).sentence(UTC) == "0 steps complete, 2 steps remaining, deadline 2026-12-07 14:00 UTC"
