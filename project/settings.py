"""Settings of the site that hosts durableruns, read from the environment by django-environ.

With nothing set, the site runs on a SQLite file (the embedded default for trying it out); set
DATABASE_URL=postgres://... for the real engine.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

import django
import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(
    DEBUG=(bool, False),
    ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1", "testserver"]),
    DURABLERUNS_LEASE_SECONDS=(float, 30.0),
)
environ.Env.read_env(BASE_DIR / ".env")  # optional; absent by default

SECRET_KEY = env("SECRET_KEY", default="insecure-dev-key-change-me-in-production")
DEBUG = env("DEBUG")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "durableruns",
    "project.purchasing",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "project.wsgi.application"

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
}
if env("LISTEN_DATABASE_URL", default=""):
    # The same PostgreSQL reached directly, for the worker's LISTEN alone, when DATABASE_URL goes through a
    # transaction pooler (docs/howto/pgbouncer.md).
    DATABASES["listen"] = env.db("LISTEN_DATABASE_URL")
    DURABLERUNS_LISTEN_DATABASE = "listen"
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # No OPTIONS: durableruns sets up its SQLite connections itself (busy timeout, WAL, BEGIN IMMEDIATE).
    # A file, not memory, so that worker subprocesses started by the tests see the same database.
    (BASE_DIR / "var").mkdir(exist_ok=True)
    DATABASES["default"]["TEST"] = {"NAME": str(BASE_DIR / "var" / "test.sqlite3")}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Mail (the alerts, durableruns.ops.alerts): SMTP on localhost, Django's default. From Django 6.1 a site names its
# mailers; before it, EMAIL_BACKEND's default is the same backend. Tests send through Django's in-memory one.
# EMAIL_BACKEND in the environment names another backend (the tests' worker processes write to a file with one).
if env("EMAIL_BACKEND", default="") and django.VERSION < (6, 1):
    EMAIL_BACKEND = env("EMAIL_BACKEND")
if django.VERSION >= (6, 1):
    MAILERS = {"default": {"BACKEND": env("EMAIL_BACKEND", default="django.core.mail.backends.smtp.EmailBackend")}}

# No REST_FRAMEWORK block: durableruns' API declares its own policy on its views (see docs/reference/settings.md).
SPECTACULAR_SETTINGS = {
    # the demo's API docs page loads Swagger UI from drf-spectacular-sidecar, never from a CDN
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# durableruns: how long a worker's claim on a run lasts without renewal (seconds, fractions allowed).
DURABLERUNS_LEASE_SECONDS = env("DURABLERUNS_LEASE_SECONDS")
# project/purchasing/orders.py (the full purchase order, its shipments, the nightly reconciliation), then any named.
DURABLERUNS_WORKFLOW_MODULES = ["project.purchasing.orders", *env.list("DURABLERUNS_WORKFLOW_MODULES", default=[])]
DURABLERUNS_RETRY_BACKOFF_SECONDS = env.float("DURABLERUNS_RETRY_BACKOFF_SECONDS", default=1.0)
DURABLERUNS_RETRY_BACKOFF_MAX_SECONDS = env.float("DURABLERUNS_RETRY_BACKOFF_MAX_SECONDS", default=300.0)
DURABLERUNS_RATE_MARGIN_SECONDS = env.float("DURABLERUNS_RATE_MARGIN_SECONDS", default=0.1)
DURABLERUNS_LOOKUP_RETRY_SECONDS = env.float("DURABLERUNS_LOOKUP_RETRY_SECONDS", default=5.0)
DURABLERUNS_MISSING_STEP_GRACE_SECONDS = env.float("DURABLERUNS_MISSING_STEP_GRACE_SECONDS", default=3600.0)
DURABLERUNS_MISSING_STEP_RETRY_SECONDS = env.float("DURABLERUNS_MISSING_STEP_RETRY_SECONDS", default=60.0)
# The PostgreSQL hot path prepares its statements; off behind a pooler that cannot keep prepared statements.
DURABLERUNS_PREPARED_STATEMENTS = env.bool("DURABLERUNS_PREPARED_STATEMENTS", default=True)
# Worker processes: threads per resume_runs, the crash budget, how long past a step's timeout it is "stuck".
DURABLERUNS_CONCURRENCY = env.int("DURABLERUNS_CONCURRENCY", default=4)
# How many due runs one claim of a --once pass may take (1: one at a time).
DURABLERUNS_PREFETCH = env.int("DURABLERUNS_PREFETCH", default=4)
DURABLERUNS_BULK_SHARE = env.float("DURABLERUNS_BULK_SHARE", default=0.5)
DURABLERUNS_MAX_CRASHES = env.int("DURABLERUNS_MAX_CRASHES", default=100)
DURABLERUNS_MAX_LOOKUP_ERRORS = env.int("DURABLERUNS_MAX_LOOKUP_ERRORS", default=120)
DURABLERUNS_STUCK_MARGIN_SECONDS = env.float("DURABLERUNS_STUCK_MARGIN_SECONDS", default=60.0)
DURABLERUNS_SHUTDOWN_GRACE_SECONDS = env.float("DURABLERUNS_SHUTDOWN_GRACE_SECONDS", default=30.0)
DURABLERUNS_LISTEN = env.bool("DURABLERUNS_LISTEN", default=True)
DURABLERUNS_STANDBY_INTENTS = env("DURABLERUNS_STANDBY_INTENTS", default=None)
# The demo's nightly reconciliation (project/purchasing/orders.py): a cron expression in Europe/Amsterdam time;
# empty: not declared (the test suite's workers run without it).
PURCHASING_RECONCILIATION_CRON = env("PURCHASING_RECONCILIATION_CRON", default="0 2 * * *")

# Django's Tasks run as durableruns runs (on Django 5.2 through the django-tasks backport: durableruns[tasks]);
# QUEUES = [] accepts any queue name, and resume_runs --queue NAME limits a worker to some.
if find_spec("django.tasks") or find_spec("django_tasks"):
    TASKS = {
        "default": {
            "BACKEND": "durableruns.tasks.DurableRunsBackend",
            "QUEUES": [],
            "OPTIONS": {"MAX_ATTEMPTS": env.int("DURABLERUNS_TASK_MAX_ATTEMPTS", default=1)},
        }
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"durableruns": {"handlers": ["console"], "level": env("DURABLERUNS_LOG_LEVEL", default="WARNING")}},
}
