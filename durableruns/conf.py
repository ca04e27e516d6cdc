"""durableruns' settings with their defaults, read when used so tests and deployments can override them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS
from django.dispatch import receiver
from django.utils.module_loading import import_string

# The alias is read on every statement of the hot path: kept once read, forgotten when a test changes the setting.
_database: str | None = None


def database() -> str:
    """The database alias that holds every table of durableruns, and takes its claims, locks, raw statements,
    transactions and LISTEN/NOTIFY: DURABLERUNS_DATABASE, "default" by default.

    Name another alias to keep the runs apart from the site's own data (a PostgreSQL of their own, say), and add
    durableruns.routers.DurableRunsRouter to DATABASE_ROUTERS so Django sends the app's queries and migrations
    there (checks durableruns.W004 and E007). A run started inside a transaction on that alias joins it; one
    started inside a transaction on another alias only is committed on its own (docs/howto/own-database.md).
    """
    global _database
    if _database is None:
        _database = str(getattr(settings, "DURABLERUNS_DATABASE", DEFAULT_DB_ALIAS))
    return _database


@receiver(setting_changed)
def _forget_database(*, setting: str, **kwargs: Any) -> None:
    global _database
    if setting == "DURABLERUNS_DATABASE":
        _database = None


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


def rate_margin() -> timedelta:
    """How much longer than its window a step's rate limit keeps a start counted (durableruns.rates):
    DURABLERUNS_RATE_MARGIN_SECONDS, 0.1 by default. The limit counts starts on the database's clock; the far system
    sees each call a little after its start (the intent's commit, the network), by an amount that varies from call
    to call. The margin absorbs that variation, so the far system's own windows hold no more than N either; at the
    cost of the margin once a window (5/s becomes 5 every 1.1 s at the most)."""
    margin = float(getattr(settings, "DURABLERUNS_RATE_MARGIN_SECONDS", 0.1))
    if margin < 0:
        raise ImproperlyConfigured(f"DURABLERUNS_RATE_MARGIN_SECONDS must be zero or more, not {margin!r}")
    return timedelta(seconds=margin)


def max_lookup_errors() -> int:
    """How many times in a row the lookup of one in-doubt attempt may raise (or answer neither a dict nor None)
    before the run stops for staff with its last error; DURABLERUNS_MAX_LOOKUP_ERRORS, 120 by default (ten
    minutes at the default DURABLERUNS_LOOKUP_RETRY_SECONDS). Counted from the run's record, so a new worker
    counts on where the last one stopped."""
    return int(getattr(settings, "DURABLERUNS_MAX_LOOKUP_ERRORS", 120))


def max_crashes() -> int:
    """How many times a step may end in doubt (its worker died, or the call raised without an answer) before the
    run stops for staff; DURABLERUNS_MAX_CRASHES, 100 by default (as DBOS's recovery attempts). Observed failures
    count against the step's own max_attempts instead."""
    return int(getattr(settings, "DURABLERUNS_MAX_CRASHES", 100))


def hold_results() -> float:
    """Seconds a chain of steps declared intent=False may keep its results in memory to commit them together
    (durableruns.held); DURABLERUNS_HOLD_RESULTS_SECONDS, 0.05 by default. A crash redoes at most that much of
    such steps' work plus the step in hand; 0 commits each result alone. Negative is refused."""
    seconds = float(getattr(settings, "DURABLERUNS_HOLD_RESULTS_SECONDS", 0.05))
    if seconds < 0:
        raise ImproperlyConfigured(f"DURABLERUNS_HOLD_RESULTS_SECONDS must be 0 or more, not {seconds}")
    return seconds


def prefetch() -> int:
    """How many due runs one claim of a single pass (resume_runs --once, resume_due) may take; the runs its thread
    does not begin at once wait in the pass for the process's next free thread (durableruns.store.prefetch);
    DURABLERUNS_PREFETCH, 4 by default; 1 claims one run at a time."""
    value = getattr(settings, "DURABLERUNS_PREFETCH", 4)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ImproperlyConfigured(f"DURABLERUNS_PREFETCH must be a whole number of 1 or more, not {value!r}")
    return value


def internal_error_backoff() -> timedelta:
    """How long a run whose pass raised inside durableruns itself (a bug, or data the database refused) waits
    before a worker tries it again; DURABLERUNS_INTERNAL_ERROR_BACKOFF_SECONDS, 60 by default."""
    return timedelta(seconds=float(getattr(settings, "DURABLERUNS_INTERNAL_ERROR_BACKOFF_SECONDS", 60.0)))


def missing_step_grace() -> timedelta:
    """How long a run whose plan has steps this deploy lacks is left for a worker whose deploy has them (a
    rolling deploy) before it stops for staff; DURABLERUNS_MISSING_STEP_GRACE_SECONDS, 3600 by default. Measured
    on the database's clock from when a worker first found it lacking."""
    return timedelta(seconds=float(getattr(settings, "DURABLERUNS_MISSING_STEP_GRACE_SECONDS", 3600.0)))


def missing_step_retry() -> timedelta:
    """How soon such a run is looked at again meanwhile; DURABLERUNS_MISSING_STEP_RETRY_SECONDS, 60 by default."""
    return timedelta(seconds=float(getattr(settings, "DURABLERUNS_MISSING_STEP_RETRY_SECONDS", 60.0)))


def schedule_catch_up_max() -> int:
    """The most missed slots a catch_up="all" schedule starts after downtime (the latest ones);
    DURABLERUNS_SCHEDULE_CATCH_UP_MAX, 100 by default."""
    return max(1, int(getattr(settings, "DURABLERUNS_SCHEDULE_CATCH_UP_MAX", 100)))


def concurrency() -> int:
    """Runs one resume_runs process works at once (threads, each with its own connection) when --concurrency is
    not given; DURABLERUNS_CONCURRENCY, 4 by default. SQLite always gets 1: it has one writer at a time."""
    return int(getattr(settings, "DURABLERUNS_CONCURRENCY", 4))


def shutdown_grace() -> float:
    """Seconds a stopping worker (SIGTERM, SIGINT) lets the steps in hand finish before it exits anyway;
    DURABLERUNS_SHUTDOWN_GRACE_SECONDS, 30 by default. The record is safe either way: that is what the intent
    commit is for."""
    return float(getattr(settings, "DURABLERUNS_SHUTDOWN_GRACE_SECONDS", 30.0))


def stuck_margin() -> timedelta:
    """How long past its declared timeout a step in hand may run before the worker's log, its summary and the admin
    say it outlived it; DURABLERUNS_STUCK_MARGIN_SECONDS, 60 by default."""
    return timedelta(seconds=float(getattr(settings, "DURABLERUNS_STUCK_MARGIN_SECONDS", 60.0)))


def listen() -> bool:
    """Whether an idle --loop worker on PostgreSQL listens for notifications (LISTEN/NOTIFY) to pick new work up
    at once; DURABLERUNS_LISTEN, true by default. Off, it polls every --interval (and wakes at the next wake time),
    as it does while its listening connection is lost: for a site whose pooler cannot hold a LISTEN, and for the
    benchmarks' degraded figure."""
    return bool(getattr(settings, "DURABLERUNS_LISTEN", True))


def listen_database() -> str:
    """The database alias the listener's own connection LISTENs on; DURABLERUNS_LISTEN_DATABASE, by default the
    runs' own alias (DURABLERUNS_DATABASE, itself "default" by default). Behind a transaction pooler (PgBouncer)
    name an alias that reaches the same PostgreSQL directly: a pooler hands the LISTEN's server connection to
    other clients, and no notification comes back through it. The worker checks at start that one does, and
    polls, saying so, if none does."""
    return str(getattr(settings, "DURABLERUNS_LISTEN_DATABASE", None) or database())


def standby_intents() -> str | None:
    """The synchronous_commit level (on, remote_write, remote_apply) that the intent commits of steps without a
    key or lookup (policy escalate, and steps declared wait_for_standby=True) are made with, so that a failover to
    a standby cannot lose them where the site's replication is otherwise asynchronous; DURABLERUNS_STANDBY_INTENTS,
    None by default (every commit as the server is set). It waits only for the standbys named in the server's
    synchronous_standby_names."""
    value = getattr(settings, "DURABLERUNS_STANDBY_INTENTS", None)
    if value in (None, "", False):
        return None
    level = str(value)
    if level not in STANDBY_LEVELS:
        raise ImproperlyConfigured(
            f"DURABLERUNS_STANDBY_INTENTS must be one of {', '.join(STANDBY_LEVELS)}, not {value!r}"
        )
    return level


STANDBY_LEVELS = ("on", "remote_write", "remote_apply")


def default_timeout() -> timedelta:
    """The longest a step's far call may stay open when the step declares no timeout."""
    return timedelta(seconds=float(getattr(settings, "DURABLERUNS_DEFAULT_TIMEOUT_SECONDS", 30.0)))


def prepared_statements() -> bool:
    """Whether the PostgreSQL hot path prepares its statements; turn off behind a pooler that cannot keep them."""
    return bool(getattr(settings, "DURABLERUNS_PREPARED_STATEMENTS", True))


# -- the REST API's policy and the SQLite connection set-up (each a Django setting with its default) -----------


def _classes(setting: str, default: Sequence[str | type]) -> list[type]:
    """The classes a setting names (dotted paths or the classes themselves), or the default's."""
    value = getattr(settings, setting, None)
    names = default if value is None else value
    return [import_string(name) if isinstance(name, str) else name for name in names]


def api_authentication_classes() -> list[type]:
    """How the API knows who calls: DURABLERUNS_API_AUTHENTICATION_CLASSES.

    By default a token (when rest_framework.authtoken is installed) and then the session. The first class names
    the challenge of a 401, so a token comes first; without one, the app's session authentication still answers
    an anonymous call 401 with a challenge rather than 403. Whatever the site's REST_FRAMEWORK says, the API
    uses these.
    """
    default: list[str] = []
    if apps.is_installed("rest_framework.authtoken"):
        default.append("rest_framework.authentication.TokenAuthentication")
    default.append("durableruns.api.authentication.SessionAuthentication")
    return _classes("DURABLERUNS_API_AUTHENTICATION_CLASSES", default)


def api_permission_classes() -> list[type]:
    """Checked before each endpoint's own model permission: DURABLERUNS_API_PERMISSION_CLASSES.

    By default only IsAuthenticated. A site may add its own (IsAdminUser, an IP allow-list); the permission an
    endpoint needs (view_runstate, start_run, ...) is always checked on top and cannot be removed here.
    """
    return _classes("DURABLERUNS_API_PERMISSION_CLASSES", ["rest_framework.permissions.IsAuthenticated"])


def api_renderer_classes() -> list[type]:
    """How answers are rendered: DURABLERUNS_API_RENDERER_CLASSES.

    JSON, plus DRF's browsable pages only when rest_framework is an installed app (its templates live there, so
    without it a browser's request would be a 500).
    """
    default = ["rest_framework.renderers.JSONRenderer"]
    if apps.is_installed("rest_framework"):
        default.append("rest_framework.renderers.BrowsableAPIRenderer")
    return _classes("DURABLERUNS_API_RENDERER_CLASSES", default)


def api_page_size() -> int:
    """Rows per page of the runs list and the escalation queue: DURABLERUNS_API_PAGE_SIZE, 50 by default."""
    return int(getattr(settings, "DURABLERUNS_API_PAGE_SIZE", 50))


def api_exception_handler() -> Callable[..., Any]:
    """The handler of the API's views: DURABLERUNS_API_EXCEPTION_HANDLER (a dotted path).

    By default the app's own, which answers each durableruns error with its status and code; a site's wrapper
    should call it first.
    """
    value = getattr(settings, "DURABLERUNS_API_EXCEPTION_HANDLER", "durableruns.api.exceptions.exception_handler")
    return import_string(value) if isinstance(value, str) else value


def sqlite_tuning() -> bool:
    """Whether durableruns sets up each SQLite connection (busy timeout, WAL, BEGIN IMMEDIATE) where the
    site's OPTIONS do not: DURABLERUNS_SQLITE_TUNING, true by default."""
    return bool(getattr(settings, "DURABLERUNS_SQLITE_TUNING", True))


def sqlite_busy_timeout_ms() -> int:
    """How long a SQLite connection waits for the write lock before "database is locked":
    DURABLERUNS_SQLITE_BUSY_TIMEOUT_SECONDS (30) unless the site's OPTIONS set a timeout."""
    return int(float(getattr(settings, "DURABLERUNS_SQLITE_BUSY_TIMEOUT_SECONDS", 30.0)) * 1000)


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
#   stopped     a run stopped for staff with no escalation open    DURABLERUNS_HEALTH_STOPPED_{WARNING,CRITICAL}
#               (crash budget spent, ...) longer than this          _SECONDS
#               (at once, 4 hours: nobody else is asked about it)
#   skew        this host's clock this far from the database's    DURABLERUNS_HEALTH_SKEW_{WARNING,CRITICAL}_SECONDS
#               (a third of the lease, the whole lease: 10 s and 30 s with the default lease)
_HEALTH_DEFAULTS: dict[str, tuple[float, float]] = {
    "escalation": (4 * 3600.0, 24 * 3600.0),
    "stopped": (0.0, 4 * 3600.0),
    "due": (300.0, 900.0),
    "stuck": (60.0, 600.0),
}


def health_thresholds(check: str) -> tuple[timedelta, timedelta]:
    """The (warning, critical) thresholds of one of runs_health's checks (escalation, stopped, due, stuck, skew), from
    DURABLERUNS_HEALTH_<CHECK>_WARNING_SECONDS and _CRITICAL_SECONDS; the defaults are in the table above."""
    if check == "skew":
        defaults = (lease_seconds() / 3, lease_seconds())
    else:
        defaults = _HEALTH_DEFAULTS[check]
    name = f"DURABLERUNS_HEALTH_{check.upper()}"
    return (
        timedelta(seconds=float(getattr(settings, f"{name}_WARNING_SECONDS", defaults[0]))),
        timedelta(seconds=float(getattr(settings, f"{name}_CRITICAL_SECONDS", defaults[1]))),
    )


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


def workflow_groups() -> dict[str, frozenset[str]]:
    """The workflows seen only by superusers and the members of their groups: DURABLERUNS_WORKFLOW_GROUPS, a dict
    of workflow name to a list of group names ({"payroll": ["Payroll"]}), empty by default (every workflow seen by
    whoever the model permissions admit). A workflow named there is left out of every list, count, search and
    queue for anyone else, and its runs' pages and API details are 404 (durableruns.scopes); within it, the model
    permissions still decide what a member may do. A malformed value is check durableruns.E032."""
    value = getattr(settings, "DURABLERUNS_WORKFLOW_GROUPS", None) or {}
    if not isinstance(value, dict):
        raise ImproperlyConfigured(
            f"DURABLERUNS_WORKFLOW_GROUPS must be a dict of workflow name to a list of group names, not {value!r}"
        )
    groups = {}
    for workflow, names in value.items():
        if (
            not isinstance(workflow, str)
            or isinstance(names, str)
            or not isinstance(names, (list, tuple, set, frozenset))
            or not all(isinstance(n, str) and n for n in names)
        ):
            raise ImproperlyConfigured(
                f"DURABLERUNS_WORKFLOW_GROUPS[{workflow!r}] must be a list of group names, not {names!r}"
            )
        groups[workflow] = frozenset(names)
    return groups


def default_assignee() -> str:
    """The group an approval or escalation is assigned to when its declaration names none (durableruns.inbox):
    DURABLERUNS_DEFAULT_ASSIGNEE, a group name; None by default (every member of staff with the permission to
    decide it, as before the inbox)."""
    value = getattr(settings, "DURABLERUNS_DEFAULT_ASSIGNEE", None)
    if value is not None and (not isinstance(value, str) or len(value) > 150):
        raise ImproperlyConfigured(f"DURABLERUNS_DEFAULT_ASSIGNEE must be a group name or None, not {value!r}")
    return value or ""


def bulk_share() -> float:
    """The share of its time a --loop worker's bulk thread spends acting on bulks while items are pending
    (DURABLERUNS_BULK_SHARE, 0 < share <= 1, default 0.5): after each batch it rests (1 - share) / share of the time
    the batch took, so the claims and steps beside a bulk of thousands keep the machine. 1: no rest."""
    value = getattr(settings, "DURABLERUNS_BULK_SHARE", 0.5)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ImproperlyConfigured(f"DURABLERUNS_BULK_SHARE must be a number above 0 and at most 1, not {value!r}")
    return float(value)


def rest_after(busy_seconds: float, share: float) -> float:
    """How long a background thread rests after `busy_seconds` of work so that it works `share` of its time."""
    return max(0.0, busy_seconds) * (1.0 - share) / share
