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


def concurrency() -> int:
    """Runs one resume_runs process works at once (threads, each with its own connection) when --concurrency is
    not given; DURABLERUNS_CONCURRENCY, 4 by default. SQLite always gets 1: it has one writer at a time."""
    return int(getattr(settings, "DURABLERUNS_CONCURRENCY", 4))


def shutdown_grace() -> float:
    """Seconds a stopping worker (SIGTERM, SIGINT) lets the steps in hand finish before it exits anyway;
    DURABLERUNS_SHUTDOWN_GRACE_SECONDS, 30 by default. The record is safe either way: that is what the intent
    commit is for."""
    return float(getattr(settings, "DURABLERUNS_SHUTDOWN_GRACE_SECONDS", 30.0))


def default_timeout() -> timedelta:
    """The longest a step's far call may stay open when the step declares no timeout."""
    return timedelta(seconds=float(getattr(settings, "DURABLERUNS_DEFAULT_TIMEOUT_SECONDS", 30.0)))


def prepared_statements() -> bool:
    """Whether the PostgreSQL hot path prepares its statements; turn off behind a pooler that cannot keep them."""
    return bool(getattr(settings, "DURABLERUNS_PREPARED_STATEMENTS", True))
