"""The demo site's own pages (project/ and templates/): a landing page linking the back office and the API docs,
the admin named "durableruns back office", a site override of one of the app's templates, and Swagger UI served
from drf-spectacular-sidecar behind the API's authentication."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import requests
from django.contrib.auth.models import User
from django.contrib.staticfiles import finders
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_passwords(settings) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def staff() -> Client:
    User.objects.create_superuser("root", "root@example.com", "pw-root")
    client = Client()
    assert client.login(username="root", password="pw-root")
    return client


def test_the_landing_page_links_the_back_office_and_the_api_docs():
    page = Client().get("/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'href="/admin/"' in html and 'href="/api/docs/"' in html and 'href="/api/schema/"' in html


def test_the_admin_is_the_durableruns_back_office(staff):
    html = staff.get("/admin/").content.decode()
    assert "<title>Site administration | Django site admin | durableruns back office</title>" not in html
    assert re.search(r"<title>[^<]*durableruns back office</title>", html)
    assert '<a href="/admin/">durableruns back office</a>' in html
    login = Client().get("/admin/login/").content.decode()
    assert "durableruns back office" in login


def test_the_site_overrides_one_of_the_apps_templates_keeping_the_rest(staff):
    html = staff.get("/admin/durableruns/escalation/").content.decode()
    assert "Purchasing desk: before deciding a payment" in html  # the site's block
    assert "Steps no machine can settle" in html  # the app's text, kept through block.super


def test_the_api_docs_need_a_signed_in_person(staff):
    anonymous = Client().get("/api/docs/")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/admin/login/?next=/api/docs/")
    page = staff.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html
    assert not re.search(r"https?://(cdn|unpkg|fastly)", html)  # nothing from a CDN
    assert finders.find("drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")
    assert "/api/schema/" in html  # the docs read the app's schema, with the same session


def test_the_demos_runserver_command_serves_the_admins_css_with_debug_off(tmp_path):
    """bin/demo ends by printing the command that serves the back office (SERVE): run as printed, on the demo
    site as it is (DEBUG off), over real HTTP, the admin's pages come with their CSS and the app's own."""
    from project.purchasing.demo import SERVE
    from tests.conftest import ROOT, wait_until
    from tests.install.test_wheel import free_port

    port = free_port()
    command = SERVE.split()
    assert command[:3] == [".venv/bin/python", "manage.py", "runserver"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEBUG", "DJANGO_"))}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    server = subprocess.Popen(
        [sys.executable, *command[1:], f"127.0.0.1:{port}", "--noreload"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def answers() -> bool:
            try:
                return requests.get(f"{url}/admin/login/", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        wait_until(answers, timeout=60, what="the demo's runserver to answer")
        login = requests.get(f"{url}/admin/login/", timeout=30).text
        assert 'href="/static/admin/css/base.css"' in login
        for path in ("/static/admin/css/base.css", "/static/admin/js/theme.js"):
            served = requests.get(f"{url}{path}", timeout=30)
            assert served.status_code == 200, path
        css = requests.get(f"{url}/static/admin/css/base.css", timeout=30)
        assert "text/css" in css.headers["Content-Type"] and "--body-fg" in css.text
        debug = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", "from django.conf import settings; print(settings.DEBUG)"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert debug.stdout.split()[-1] == "False"  # as bin/demo's site runs: without --insecure, no CSS
    finally:
        server.terminate()
        server.wait(timeout=30)
