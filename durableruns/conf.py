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


# What runs_health reports, and when: (warning, critical) in seconds, each overridable by its own setting.
#   escalation  an escalation open longer than this               DURABLERUNS_HEALTH_ESCALATION_{WARNING,CRITICAL}
#               (4 hours, 24 hours)                               _SECONDS
#   due         a run due (pending, waiting past its wake time,   DURABLERUNS_HEALTH_DUE_{WARNING,CRITICAL}_SECONDS
#               lease expired) longer than this: no worker runs
#               (5 minutes, 15 minutes)
#   stuck       a run still held by a live lease this long past   DURABLERUNS_HEALTH_STUCK_{WARNING,CRITICAL}_SECONDS
#               its step's timeout (1 minute, 10 minutes)
#   skew        this host's clock this far from the database's    DURABLERUNS_HEALTH_SKEW_{WARNING,CRITICAL}_SECONDS
#               (a third of the lease, the whole lease: 10 s and 30 s with the default lease)
_HEALTH_DEFAULTS: dict[str, tuple[float, float]] = {
    "escalation": (4 * 3600.0, 24 * 3600.0),
    "due": (300.0, 900.0),
    "stuck": (60.0, 600.0),
}


def health_thresholds(check: str) -> tuple[timedelta, timedelta]:
    """The (warning, critical) thresholds of one of runs_health's checks (escalation, due, stuck, skew), from
    DURABLERUNS_HEALTH_<CHECK>_WARNING_SECONDS and _CRITICAL_SECONDS; the defaults are in the table above."""
    if check == "skew":
        defaults = (lease_seconds() / 3, lease_seconds())
    else:
        defaults = _HEALTH_DEFAULTS[check]
    name = f"DURABLERUNS_HEALTH_{check.upper()}"
    return (timedelta(seconds=float(getattr(settings, f"{name}_WARNING_SECONDS", defaults[0]))),
            timedelta(seconds=float(getattr(settings, f"{name}_CRITICAL_SECONDS", defaults[1]))))


def escalation_alert_period() -> timedelta:
    """How long an escalation may stay open before the staff who may decide it are e-mailed (runs_health
    --alert), and the least time between two such e-mails about it; DURABLERUNS_ESCALATION_ALERT_SECONDS,
    4 hours by default."""
    return timedelta(seconds=float(getattr(settings, "DURABLERUNS_ESCALATION_ALERT_SECONDS", 4 * 3600.0)))


def admin_base_url() -> str:
    """The scheme and host the admin is reached at (e.g. "https://ops.example.com"), for links in e-mails, which
    have no request to take them from; DURABLERUNS_ADMIN_BASE_URL, "" by default (the e-mail then carries the
    page's path alone)."""
    return str(getattr(settings, "DURABLERUNS_ADMIN_BASE_URL", "")).rstrip("/")
