"""The back office's presentation tables are exhaustive: a new zone, status or outcome cannot render blank."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from durableruns.admin import (
    ATTEMPT_BADGES,
    DECISION_LABELS,
    STATUS_TONES,
    ZONE_BADGES,
    nesting_depth,
    pretty_json,
    status_badge,
    summarize,
    zone_badge,
    zone_detail,
)
from durableruns.boundary import StepAttempt, Zone
from durableruns.models import RunStatus, StepStatus
from durableruns.policies import Outcome


def test_every_zone_has_a_badge():
    assert set(ZONE_BADGES) == set(Zone)
    labels = [label for label, _ in ZONE_BADGES.values()]
    assert len(set(labels)) == len(labels)  # no two zones look alike


def test_every_run_status_every_attempt_status_and_every_outcome_has_a_presentation():
    assert set(STATUS_TONES) == set(RunStatus)
    assert set(ATTEMPT_BADGES) == set(StepStatus)
    assert set(DECISION_LABELS) == set(Outcome)


@pytest.mark.parametrize("zone", list(Zone))
def test_each_zone_badge_and_detail_say_the_zone(zone):
    label, tone = ZONE_BADGES[zone]
    assert f'class="dr-badge dr-{tone}">{label}</span>' in zone_badge(zone)
    moment = datetime(2026, 8, 8, 14, 7, 12, tzinfo=UTC)
    status = {Zone.DONE: "completed", Zone.IN_DOUBT: "started", Zone.FAILED: "failed",
              Zone.WAITING: "started"}.get(zone)
    latest = None if status is None else StepAttempt(step="charge", attempt=2, status=status, started_at=moment,
                                                     finished_at=moment, error="Rejected: card declined")
    detail = zone_detail(zone, latest)
    expected = {Zone.DONE: "done at 2026-08-08 14:07:12 (attempt 2)",
                Zone.IN_DOUBT: "in doubt since 2026-08-08 14:07:12",
                Zone.FAILED: "Rejected: card declined",
                Zone.WAITING: "waiting since 2026-08-08 14:07:12",
                Zone.NOT_STARTED: "remaining"}[zone]
    assert expected in detail


def test_status_badges_use_the_status_label():
    assert ">needs decision</span>" in status_badge("needs_decision")
    assert "dr-alert" in status_badge("needs_decision") and "dr-ok" in status_badge("completed")


@pytest.mark.parametrize(
    ("result", "skip", "expected"),
    [
        ({"charge_id": "ch_1", "idempotency_key": "po-1:charge", "amount": 120}, [], "charge_id ch_1"),
        ({"check_id": "cc_1", "request_id": "po-1:credit_check"}, ["po-1:credit_check"], "check_id cc_1"),
        ({"buyer": "Acme", "email": "a@x", "reference": "PO-1", "lines": [{}, {}]}, [], "reference PO-1, buyer Acme"),
        ({"lines": [1, 2]}, [], "{1 keys}"),
        ([1, 2, 3], [], "[3 items]"),
        (None, [], "no result"),
        (42, [], "42"),
    ],
)
def test_summarize_says_what_a_result_holds_by_its_ids_first(result, skip, expected):
    assert summarize(result, skip=skip).startswith(expected)


def nested_lists(depth: int) -> list:
    outer: list = []
    inner = outer
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return outer


def test_nesting_depth_counts_arrays_and_objects_without_recursing():
    assert nesting_depth(7) == 0 and nesting_depth([]) == 1 and nesting_depth({"a": [1, {"b": 2}]}) == 3
    assert nesting_depth(nested_lists(100_000)) == 100_000


def test_a_result_too_deep_for_the_encoder_is_named_on_the_page_not_a_500():
    # Recorded rows hold at most what the encoder managed in the worker; a page renders deeper in the stack.
    assert pretty_json(nested_lists(100_000)) == "(nested too deep to show: 100000 levels)"
    assert pretty_json({"b": 1, "a": [2]}) == '{\n  "a": [\n    2\n  ],\n  "b": 1\n}'
