"""Settings of the site that hosts durableruns, read from the environment by django-environ.

With nothing set, the site runs on a SQLite file (the embedded default for trying it out); set
DATABASE_URL=postgres://... for the real engine.
"""

from __future__ import annotations

from pathlib import Path

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
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (a worker, the admin, cron) share the file: wait for the lock rather than fail,
    # and take the write lock at BEGIN so a read-then-write transaction cannot deadlock.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 30, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
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

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first, so an anonymous call gets 401 with WWW-Authenticate rather than 403.
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "durableruns.api.exceptions.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "durableruns API",
    "DESCRIPTION": "Start durable runs, read their recovery boundary, decide escalated steps.",
    "VERSION": "0.1.0",
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "durableruns.models.RunStatus",
        "StepStatusEnum": "durableruns.models.StepStatus",
    },
}

# durableruns: how long a worker's claim on a run lasts without renewal (seconds, fractions allowed).
DURABLERUNS_LEASE_SECONDS = env("DURABLERUNS_LEASE_SECONDS")
DURABLERUNS_WORKFLOW_MODULES = env.list("DURABLERUNS_WORKFLOW_MODULES", default=[])
DURABLERUNS_RETRY_BACKOFF_SECONDS = env.float("DURABLERUNS_RETRY_BACKOFF_SECONDS", default=1.0)
DURABLERUNS_RETRY_BACKOFF_MAX_SECONDS = env.float("DURABLERUNS_RETRY_BACKOFF_MAX_SECONDS", default=300.0)
DURABLERUNS_LOOKUP_RETRY_SECONDS = env.float("DURABLERUNS_LOOKUP_RETRY_SECONDS", default=5.0)
# The PostgreSQL hot path prepares its statements; off behind a pooler that cannot keep prepared statements.
DURABLERUNS_PREPARED_STATEMENTS = env.bool("DURABLERUNS_PREPARED_STATEMENTS", default=True)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"durableruns": {"handlers": ["console"], "level": env("DURABLERUNS_LOG_LEVEL", default="WARNING")}},
}
