"""Install durableruns as a user would: build the wheel, pip-install it into a fresh virtualenv, generate a site
with `django-admin startproject` (no REST_FRAMEWORK setting at all), add the app, migrate, run a three-step
workflow through `resume_runs`, and probe the admin and the API over HTTP against `runserver`. Then schemathesis
fuzzes that bare site's schema. The same on SQLite (the embedded default; the wheel installed without the
[postgres] extra, so no PostgreSQL driver at all) and on PostgreSQL (with it).

Nothing here imports the demo site's settings into the bare site: it sees only what the wheel holds.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from tests.conftest import wait_until

pytestmark = pytest.mark.install

PASSWORD = "pw-bare-site-1"
FUZZ_EXAMPLES = 15  # per operation and mode: about 300 requests per site

WORKFLOWS = '''
"""The bare site's own workflow: three steps, declared as the README's install section shows."""
from durableruns import Workflow

fulfil = Workflow("fulfil")


@fulfil.step(policy="re_executable")
def reserve(ctx):
    return {"reserved": ctx.input["qty"]}


@fulfil.step(policy="re_executable")
def pack(ctx):
    return {"boxes": ctx.results["reserve"]["reserved"]}


@fulfil.step(policy="escalate")
def notify(ctx):
    """Email the buyer: no key, no lookup, so a crash here goes to a person."""
    return {"sent": True}
'''

SEED = f"""
from django.contrib.auth.models import Permission, User
import durableruns

User.objects.create_superuser("root", "root@example.com", {PASSWORD!r})
clerk = User.objects.create_user("clerk", password={PASSWORD!r}, is_staff=True)   # staff, no durableruns perms
durableruns.start("fulfil", {{"qty": 3}}, run_id="order-1")
"""

MORE_RUNS = """
import durableruns
for i in range(55):
    durableruns.start("fulfil", {"qty": i}, run_id=f"bulk-{i:03d}")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_wheel_holds_the_app_only(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"durableruns", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "durableruns/py.typed" in names and "durableruns/migrations/0001_initial.py" in names
    assert "durableruns/templates/durableruns/admin/escalation_page.html" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    required = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: ") and "extra ==" not in line]
    assert [line.split(" ", 1)[1].split(">")[0].split("<")[0] for line in required] == [
        "Django",
        "djangorestframework",
        "drf-spectacular",
        "cronsim",  # schedules' cron expressions
    ]
    assert "Requires-Dist: Django<6.2,>=5.2" in metadata
    assert 'Requires-Dist: psycopg[binary]>=3.2; extra == "postgres"' in metadata
    # The classifiers name the Django and Python releases bin/test runs the suite on, and no other.
    classifiers = [line.split(":: ", 1)[1] for line in metadata.splitlines() if line.startswith("Classifier: ")]
    assert [c for c in classifiers if c.startswith("Django ::")] == ["Django :: 5.2", "Django :: 6.1"]
    assert [c for c in classifiers if re.fullmatch(r"Python :: 3\.\d+", c)] == ["Python :: 3.11", "Python :: 3.13"]
    # Each command installs its own: the demo no benchmark baseline, browser, fuzzer or type checker.
    extras = re.findall(r'^Requires-Dist: (\S+?)[<>=;\[].*extra == "(\w+)"', metadata, re.MULTILINE)
    demo = {name for name, extra in extras if extra == "demo"}
    assert demo == {"django-environ", "drf-spectacular-sidecar"}
    assert {"pytest", "playwright", "schemathesis", "mypy"} <= {name for name, extra in extras if extra == "test"}
    assert {"dbos", "matplotlib"} <= {name for name, extra in extras if extra == "bench"}


@dataclass
class BareSite:
    """A site made by startproject in the fresh virtualenv, served by runserver on a free loopback port."""

    root: Path
    venv: Path
    env: dict[str, str]
    database: dict[str, Any] = field(default_factory=dict)
    url: str = ""
    server: subprocess.Popen[str] | None = None
    log: list[str] = field(default_factory=list)

    def manage(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.venv / "bin" / "python"), "manage.py", *args],
            cwd=self.root,
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check:
            assert done.returncode == 0, f"manage.py {' '.join(args)}: {done.stdout}{done.stderr}"
        return done

    def session(self, username: str) -> requests.Session:
        """Sign in through the admin's login form, as a person would; the session then calls the API."""
        client = requests.Session()
        form = client.get(f"{self.url}/admin/login/", timeout=30)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert token, form.text
        signed_in = client.post(
            f"{self.url}/admin/login/?next=/admin/",
            timeout=30,
            allow_redirects=False,
            data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token.group(1), "next": "/admin/"},
        )
        assert signed_in.status_code == 302 and signed_in.headers["Location"] == "/admin/", signed_in.text
        client.headers["X-CSRFToken"] = client.cookies["csrftoken"]
        return client


def make_site(base: Path, venv: Path, database: dict[str, Any]) -> BareSite:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "DURABLERUNS_"))}
    env.pop("DATABASE_URL", None)
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    subprocess.run(
        [str(venv / "bin" / "django-admin"), "startproject", "mysite", str(base)], check=True, env=env, timeout=60
    )
    site = BareSite(root=base, venv=venv, env=env, database=database)
    site.manage("startapp", "shop")
    (base / "shop" / "workflows.py").write_text(WORKFLOWS)
    settings_py = base / "mysite" / "settings.py"
    text = settings_py.read_text()
    assert "REST_FRAMEWORK" not in text
    # What the README's install section asks for, and nothing else.
    text += (
        '\nINSTALLED_APPS += ["rest_framework", "drf_spectacular", "durableruns", "shop"]\n'
        f"DATABASES = {{'default': {database!r}}}\n"
    )
    settings_py.write_text(text)
    urls_py = base / "mysite" / "urls.py"
    urls = urls_py.read_text()
    assert "from django.urls import path" in urls and "urlpatterns = [" in urls
    urls = urls.replace("from django.urls import path", "from django.urls import include, path")
    urls = urls.replace("urlpatterns = [", 'urlpatterns = [\n    path("api/", include("durableruns.api.urls")),')
    urls_py.write_text(urls)
    return site


def serve(site: BareSite) -> None:
    port = free_port()
    site.url = f"http://127.0.0.1:{port}"
    # runserver logs every request on stderr: to a file, since a pipe nobody reads fills up and stops the server.
    log = (site.root / "runserver.log").open("w")
    site.server = subprocess.Popen(
        [str(site.venv / "bin" / "python"), "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=site.root,
        env=site.env,
        stdout=subprocess.DEVNULL,
        stderr=log,
        text=True,
    )
    log.close()  # the server has its own copy

    def answers() -> bool:
        try:
            return requests.get(f"{site.url}/admin/login/", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    wait_until(answers, timeout=60, what="runserver to answer")


def postgres_database() -> dict[str, Any]:
    """A database of its own beside the suite's (its name + "_bare"), created afresh."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (set DATABASE_URL=postgres://...)")
    s = connection.settings_dict
    name = f"{s['NAME']}_bare"  # the suite's test database's name (test_...), plus _bare
    dsn = {
        "host": s["HOST"] or "127.0.0.1",
        "port": s["PORT"] or 5432,
        "user": s["USER"] or "postgres",
        "dbname": "postgres",
    }
    with psycopg.connect(**dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": dsn["user"],
        "HOST": dsn["host"],
        "PORT": str(dsn["port"]),
    }


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def site(
    request: pytest.FixtureRequest, venvs: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BareSite]:
    """The SQLite site installs the wheel without the [postgres] extra, as the README's step 1 says such a site
    does; the PostgreSQL site with it."""
    base = tmp_path_factory.mktemp(f"site-{request.param}")
    if request.param == "sqlite":
        database: dict[str, Any] = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(base / "db.sqlite3")}
        venv = venvs("")
    else:
        database = postgres_database()
        venv = venvs("[postgres]")
    site = make_site(base, venv, database)
    site.manage("check")
    site.manage("migrate", "-v0")
    site.manage("shell", input=SEED)
    serve(site)
    yield site
    assert site.server is not None
    site.server.terminate()
    site.server.communicate(timeout=30)
    if database["ENGINE"].endswith("postgresql"):
        dsn = {"host": database["HOST"], "port": database["PORT"], "user": database["USER"], "dbname": "postgres"}
        with psycopg.connect(**dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database["NAME"]}" WITH (FORCE)')


def test_each_site_has_the_driver_it_asked_for(site: BareSite):
    """The SQLite site has no PostgreSQL driver at all, and yet it loaded, migrated and started a run (the
    fixture); the PostgreSQL site has psycopg from the extra."""
    on_postgres = site.database["ENGINE"] == "django.db.backends.postgresql"
    found = subprocess.run(
        [str(site.venv / "bin" / "python"), "-c", "import psycopg"], capture_output=True, text=True, timeout=60
    )
    assert (found.returncode == 0) == on_postgres, found.stderr
    if not on_postgres:
        assert "No module named 'psycopg'" in found.stderr
        assert "psycopg" not in site.manage("shell", "-c", "import sys; print(sorted(sys.modules))").stdout


def test_a_three_step_workflow_runs_through_resume_runs(site: BareSite):
    site.manage("resume_runs", "--once")  # exit status 0, or manage() fails the test
    root = site.session("root")
    response = root.get(f"{site.url}/api/runs/order-1/", timeout=30)
    assert response.status_code == 200, response.text[:3000]
    run = response.json()
    assert run["status"] == "completed" and run["boundary"]["done"] == ["reserve", "pack", "notify"]
    assert [a["result"] for a in run["attempts"]] == [{"reserved": 3}, {"boxes": 3}, {"sent": True}]
    shown = site.manage("show_run", "order-1")
    assert "3 steps complete" in shown.stdout or "all 3 steps complete" in shown.stdout


def test_staff_sign_in_to_the_admin_and_see_the_runs(site: BareSite):
    root = site.session("root")
    page = root.get(f"{site.url}/admin/durableruns/runstate/", timeout=30)
    assert page.status_code == 200 and "order-1" in page.text
    queue = root.get(f"{site.url}/admin/durableruns/escalation/", timeout=30)
    assert queue.status_code == 200


@pytest.mark.parametrize("path", ["/api/runs/", "/api/runs/order-1/", "/api/escalations/", "/api/schema/"])
def test_anonymous_calls_get_a_401_with_a_challenge_and_no_data(site: BareSite, path: str):
    response = requests.get(f"{site.url}{path}", timeout=30, headers={"Accept": "application/json"})
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Session realm="durableruns"'
    assert response.json() == {"detail": "Authentication credentials were not provided."}


def test_a_browser_gets_pages_not_errors(site: BareSite):
    anonymous = requests.get(f"{site.url}/api/runs/", timeout=30, headers={"Accept": "text/html"})
    assert anonymous.status_code == 401 and "order-1" not in anonymous.text
    signed_in = site.session("root").get(f"{site.url}/api/runs/", timeout=30, headers={"Accept": "text/html"})
    assert signed_in.status_code == 200 and "order-1" in signed_in.text


@pytest.mark.parametrize("path", ["/api/runs/", "/api/runs/order-1/", "/api/escalations/"])
def test_staff_without_the_apps_permissions_get_403(site: BareSite, path: str):
    response = site.session("clerk").get(f"{site.url}{path}", timeout=30)
    assert response.status_code == 403
    assert set(response.json()) == {"detail"} and "durableruns.view_" in response.json()["detail"]
    refused = site.session("clerk").post(f"{site.url}/api/runs/", json={"workflow": "fulfil", "input": {}}, timeout=30)
    assert refused.status_code == 403


def test_errors_are_400_404_409_as_documented(site: BareSite):
    root = site.session("root")
    missing = root.get(f"{site.url}/api/runs/nobody/", timeout=30)
    assert missing.status_code == 404 and missing.json()["code"] == "run_not_found"
    unknown = root.post(f"{site.url}/api/runs/", json={"workflow": "nope", "input": {}}, timeout=30)
    assert unknown.status_code == 400 and unknown.json()["code"] == "unknown_workflow"
    duplicate = root.post(
        f"{site.url}/api/runs/", json={"workflow": "fulfil", "input": {"qty": 1}, "run_id": "order-1"}, timeout=30
    )
    assert duplicate.status_code == 409 and duplicate.json()["code"] == "duplicate_run"
    no_escalation = root.post(
        f"{site.url}/api/escalations/999999/decide/", json={"outcome": "abandon", "note": "n"}, timeout=30
    )
    assert no_escalation.status_code == 404 and no_escalation.json()["code"] == "escalation_not_found"
    started = root.post(
        f"{site.url}/api/runs/", json={"workflow": "fulfil", "input": {"qty": 2}, "run_id": "order-2"}, timeout=30
    )
    assert started.status_code == 201 and started.headers["Location"].endswith("/api/runs/order-2/")


def test_the_list_is_paginated_by_a_cursor(site: BareSite):
    site.manage("shell", input=MORE_RUNS)
    root = site.session("root")
    first = root.get(f"{site.url}/api/runs/", timeout=30).json()
    assert set(first) == {"next", "previous", "results"} and len(first["results"]) == 50
    second = root.get(first["next"], timeout=30).json()
    ids = [r["run_id"] for r in first["results"] + second["results"]]
    assert len(ids) == len(set(ids)) and {"order-1", "bulk-000", "bulk-054"} <= set(ids)


def test_the_schema_is_served_and_generates_without_warnings(site: BareSite):
    schema = site.session("root").get(f"{site.url}/api/schema/?format=json", timeout=30).json()
    assert schema["info"]["title"] == "durableruns API"
    assert {"/api/runs/", "/api/runs/{run_id}/", "/api/escalations/"} <= set(schema["paths"])
    assert "tokenAuth" not in schema["components"]["securitySchemes"]  # authtoken is not installed here
    generated = site.manage("spectacular", "--fail-on-warn", "--file", str(site.root / "schema.yaml"), check=False)
    assert generated.returncode == 0, generated.stderr
    assert "/api/runs/{run_id}/cancel/" in (site.root / "schema.yaml").read_text()


def test_fuzzing_the_bare_sites_schema_finds_no_server_error(site: BareSite):
    root = site.session("root")
    headers = {
        "Cookie": f"sessionid={root.cookies['sessionid']}; csrftoken={root.cookies['csrftoken']}",
        "X-CSRFToken": root.cookies["csrftoken"],
    }
    schema = schemathesis.openapi.from_url(f"{site.url}/api/schema/?format=json", headers=headers)
    statuses: dict[str, set[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        label = f"{operation.method.upper()} {operation.path}"
        seen = statuses.setdefault(label, set())
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=FUZZ_EXAMPLES,
                derandomize=True,
                deadline=None,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def call(case: schemathesis.Case) -> None:
                response = case.call(headers=headers)
                seen.add(response.status_code)  # noqa: B023  (called within this iteration)
                case.validate_response(response, checks=[not_a_server_error])

            call()
    # list, start, read, cancel, retry, restart, adopt_plan, events, the events stream, decide (an approval); the
    # queue and its decide; a bulk act and its progress; the inbox, a take and a release
    assert len(statuses) == 17
    assert 200 in statuses["GET /api/runs/"] and 201 in statuses["POST /api/runs/"], json.dumps(
        {k: sorted(v) for k, v in statuses.items()}
    )
