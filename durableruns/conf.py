"""durableruns' settings with their defaults, read when used so tests and deployments can override them."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings


def lease_seconds() -> float:
    """How long a claim lasts without renewal; DURABLERUNS_LEASE_SECONDS, 30 by default."""
    return float(getattr(settings, "DURABLERUNS_LEASE_SECONDS", 30.0))


def retry_backoff() -> timedelta:
    """The wait before the second attempt after an observed failure; it doubles each time."""
    return timedelta(seconds=float(getattr(settings, "DURABLERUNS_RETRY_BACKOFF_SECONDS", 1.0)))


def retry_backoff_max() -> timedelta:
    return timedelta(seconds=float(getattr(settings, "DURABLERUNS_RETRY_BACKOFF_MAX_SECONDS", 300.0)))


def lookup_retry() -> timedelta:
    """How soon a lookup that raised is asked again."""
    return timedelta(seconds=float(getattr(settings, "DURABLERUNS_LOOKUP_RETRY_SECONDS", 5.0)))


def max_crashes() -> int:
    """How many times a step may end in doubt (its worker died, or the call raised without an answer) before the
    run stops for staff; DURABLERUNS_MAX_CRASHES, 100 by default (as DBOS's recovery attempts). Observed failures
    count against the step's own max_attempts instead."""
    return int(getattr(settings, "DURABLERUNS_MAX_CRASHES", 100))


def internal_error_backoff() -> timedelta:
    """How long a run whose pass raised inside durableruns itself (a bug, or data the database refused) waits
    before a worker tries it again; DURABLERUNS_INTERNAL_ERROR_BACKOFF_SECONDS, 60 by default."""
    return timedelta(seconds=float(getattr(settings, "DURABLERUNS_INTERNAL_ERROR_BACKOFF_SECONDS", 60.0)))


def default_timeout() -> timedelta:
    """The longest a step's far call may stay open when the step declares no timeout."""
    return timedelta(seconds=float(getattr(settings, "DURABLERUNS_DEFAULT_TIMEOUT_SECONDS", 30.0)))


def prepared_statements() -> bool:
    """Whether the PostgreSQL hot path prepares its statements; turn off behind a pooler that cannot keep them."""
    return bool(getattr(settings, "DURABLERUNS_PREPARED_STATEMENTS", True))


# -- operations (durableruns.ops: retention, health, alerts, metrics) ----------------------------------------


def prune_days() -> float:
    """How many days a finished run (completed, cancelled, failed) is kept after it finished, when prune_runs is
    given no --older-than; DURABLERUNS_PRUNE_DAYS, 30 by default."""
    return float(getattr(settings, "DURABLERUNS_PRUNE_DAYS", 30))


def prune_evidence_days() -> float:
    """How many days a finished run that was ever escalated or touched by staff (an escalation or an intervention
    exists) is kept: it is evidence of who decided what; DURABLERUNS_PRUNE_EVIDENCE_DAYS, 365 by default. A run is
    kept for the longer of this and the period prune_runs is given."""
    return float(getattr(settings, "DURABLERUNS_PRUNE_EVIDENCE_DAYS", 365))
