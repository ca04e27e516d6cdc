"""The Django settings the documentation's build runs under: the app and what it builds on, nothing of the demo
site (project/), so that the `docs` extra alone builds the site (tests/install/test_docs.py holds it). Nothing
connects to a database while the pages are built."""

SECRET_KEY = "docs-build-only"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "durableruns",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
ROOT_URLCONF = "docs_urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
