"""Who may read and who may act: anonymous callers get a 401 with a challenge and no data, a signed-in user
without the app's view permissions a 403, token and session both work, and each writing endpoint needs its
permission, refusing without changing anything. None of it comes from the site's REST_FRAMEWORK."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from durableruns.models import Escalation, Intervention, RunState, RunStatus, RunStep
from tests.api.conftest import escalated_run
from tests.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)

READS = ["/api/runs/", "/api/runs/po-1/", "/api/escalations/", "/api/escalations/?state=all"]


def counts() -> tuple[int, int, int]:
    return RunState.objects.count(), RunStep.objects.count(), Intervention.objects.count()


@pytest.fixture
def seeded() -> Escalation:
    make_run(run_id="po-1")
    return escalated_run(run_id="po-2")


@pytest.mark.parametrize("url", READS)
def test_anonymous_reads_are_refused_with_a_challenge(anonymous, seeded, url):
    response = anonymous.get(url)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"  # rest_framework.authtoken is installed: the token comes first
    assert response.json() == {"detail": "Authentication credentials were not provided."}


@pytest.mark.parametrize("url", READS)
def test_without_authtoken_the_session_challenges(anonymous, seeded, url, settings):
    settings.INSTALLED_APPS = [app for app in settings.INSTALLED_APPS if app != "rest_framework.authtoken"]
    response = anonymous.get(url)
    assert response.status_code == 401 and response["WWW-Authenticate"] == 'Session realm="durableruns"'
    assert "results" not in response.json() and "input" not in response.json()


@pytest.mark.parametrize(
    "url, needs",
    [
        ("/api/runs/", "durableruns.view_runstate"),
        ("/api/runs/po-1/", "durableruns.view_runstate"),
        ("/api/escalations/", "durableruns.view_escalation"),
    ],
)
def test_reading_needs_the_view_permissions(client_for, outsider, seeded, url, needs):
    response = client_for(outsider).get(url)
    assert response.status_code == 403
    assert needs in response.json()["detail"] and set(response.json()) == {"detail"}


def test_the_sites_rest_framework_defaults_do_not_open_or_bend_the_api(
    anonymous, client_for, outsider, reader, seeded, settings
):
    settings.REST_FRAMEWORK = {
        "DEFAULT_AUTHENTICATION_CLASSES": [],
        "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
        "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
        "PAGE_SIZE": 1,
        "DEFAULT_SCHEMA_CLASS": "rest_framework.schemas.openapi.AutoSchema",
        "DEFAULT_VERSIONING_CLASS": "rest_framework.versioning.QueryParameterVersioning",
        "ALLOWED_VERSIONS": ["v9"],
        "EXCEPTION_HANDLER": "rest_framework.views.exception_handler",
    }
    assert anonymous.get("/api/runs/po-1/").status_code == 401
    assert client_for(outsider).get("/api/escalations/").status_code == 403
    assert anonymous.get("/api/runs/missing/").status_code == 401  # no 404: existence is not disclosed either
    # the app's own pages, errors and schema, not the site's
    page = client_for(reader).get("/api/runs/")
    assert page.status_code == 200 and set(page.json()) == {"next", "previous", "results"}
    assert len(page.json()["results"]) == 2
    missing = client_for(reader).get("/api/runs/missing/")
    assert missing.status_code == 404 and missing.json()["code"] == "run_not_found"
    assert client_for(reader).get("/api/schema/?format=json").status_code == 200


def test_a_site_may_add_its_own_permission_classes(client_for, reader, seeded, settings):
    settings.DURABLERUNS_API_PERMISSION_CLASSES = ["rest_framework.permissions.IsAdminUser"]
    assert client_for(reader).get("/api/runs/").status_code == 403
    reader.is_staff = True
    reader.save()
    assert client_for(reader).get("/api/runs/").status_code == 200


def test_anonymous_writes_are_refused_and_change_nothing(anonymous, seeded):
    before = counts()
    started = anonymous.post("/api/runs/", {"workflow": "scripted", "input": {}}, format="json")
    decided = anonymous.post(
        f"/api/escalations/{seeded.pk}/decide/", {"outcome": "abandon", "note": "n"}, format="json"
    )
    assert started.status_code == 401 and decided.status_code == 401
    assert counts() == before


def test_a_wrong_token_is_refused(seeded):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    response = client.get("/api/runs/")
    assert response.status_code == 401 and response.json()["detail"] == "Invalid token."


@pytest.mark.parametrize("url", READS)
def test_a_reader_reads_by_token(client_for, reader, seeded, url):
    assert client_for(reader).get(url).status_code == 200


def test_session_authentication_reads(reader, seeded):
    client = APIClient()
    assert client.login(username="reader", password="pw-reader")
    response = client.get("/api/runs/")
    assert response.status_code == 200 and len(response.json()["results"]) == 2


def test_session_writes_need_the_csrf_token(starter):
    client = APIClient(enforce_csrf_checks=True)
    assert client.login(username="starter", password="pw-starter")
    body = {"workflow": "scripted", "input": {}, "run_id": "by-session"}

    refused = client.post("/api/runs/", body, format="json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    assert not RunState.objects.filter(pk="by-session").exists()

    secret = "a" * 32
    client.cookies["csrftoken"] = secret
    accepted = client.post("/api/runs/", body, format="json", HTTP_X_CSRFTOKEN=secret)
    assert accepted.status_code == 201
    assert RunState.objects.get(pk="by-session").status == RunStatus.PENDING


def test_starting_a_run_needs_the_start_run_permission(client_for, reader, decider, starter):
    body = {"workflow": "scripted", "input": {}, "run_id": "po-new"}
    for user in (reader, decider):
        response = client_for(user).post("/api/runs/", body, format="json")
        assert response.status_code == 403
        assert response.json()["detail"] == "Starting a run needs the permission durableruns.start_run."
        assert RunState.objects.count() == 0
    assert client_for(starter).post("/api/runs/", body, format="json").status_code == 201


def test_a_refused_start_does_not_even_parse_the_body(client_for, reader):
    response = client_for(reader).post("/api/runs/", data="{not json", content_type="application/json")
    assert response.status_code == 403 and RunState.objects.count() == 0


def test_deciding_needs_the_decide_escalation_permission(client_for, reader, starter, decider, seeded):
    before = counts()
    for user in (reader, starter):
        response = client_for(user).post(
            f"/api/escalations/{seeded.pk}/decide/", {"outcome": "happened", "note": "n"}, format="json"
        )
        assert response.status_code == 403
        assert response.json()["detail"] == (
            "Deciding an escalation needs the permission durableruns.decide_escalation."
        )
    assert counts() == before and Escalation.objects.open().count() == 1
    assert RunState.objects.get(pk="po-2").status == RunStatus.NEEDS_DECISION
    response = client_for(decider).post(
        f"/api/escalations/{seeded.pk}/decide/", {"outcome": "happened", "note": "n"}, format="json"
    )
    assert response.status_code == 200 and Escalation.objects.open().count() == 0


def test_a_superuser_may_do_both(client_for, superuser, seeded):
    client = client_for(superuser)
    assert client.post("/api/runs/", {"workflow": "scripted", "input": {}}, format="json").status_code == 201
    assert (
        client.post(
            f"/api/escalations/{seeded.pk}/decide/", {"outcome": "abandon", "note": "n"}, format="json"
        ).status_code
        == 200
    )


def test_a_browser_on_a_site_without_rest_framework_installed_gets_json(client_for, reader, seeded, settings):
    settings.INSTALLED_APPS = [app for app in settings.INSTALLED_APPS if app != "rest_framework"]
    response = client_for(reader).get("/api/runs/", HTTP_ACCEPT="text/html,application/xhtml+xml,*/*;q=0.8")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert {r["run_id"] for r in response.json()["results"]} == {"po-1", "po-2"}


def test_a_browser_on_the_demo_site_gets_drfs_pages(client_for, reader, seeded):
    response = client_for(reader).get("/api/runs/", HTTP_ACCEPT="text/html")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/html")
