"""Run attributes through the API: every run in a list and in detail says its attributes; GET /api/runs/?attr=
name:value finds runs by them (repeatable, all must match, exact values); a malformed attr is a 400; a start
whose input an attribute cannot be read from is a 400 that records nothing; a scoped workflow's runs stay out."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

import durableruns
from durableruns import services
from durableruns.models import RunAttribute, RunState
from tests.api.conftest import READ, user_with
from tests.attribute_workflows import order_input

pytestmark = pytest.mark.django_db(transaction=True)


def found(client, query: str) -> list[str]:
    response = client.get(f"/api/runs/{query}")
    assert response.status_code == 200, response.content
    return sorted(r["run_id"] for r in response.json()["results"])


@pytest.fixture
def orders() -> list[str]:
    return [
        durableruns.start("attributed_order", order_input("PO-2026-0041", "Acme BV"), run_id="po-41"),
        durableruns.start("attributed_order", order_input("PO-2026-0042", "Acme BV"), run_id="po-42"),
        durableruns.start("attributed_order", order_input("PO-2026-0043", "Brouwer NV", lines=[]), run_id="po-43"),
        durableruns.start("waiting", {"total": 10}, run_id="plain"),
    ]


def test_lists_and_details_include_the_attributes(client_for, reader, orders):
    client = client_for(reader)
    rows = {r["run_id"]: r for r in client.get("/api/runs/").json()["results"]}
    assert rows["po-41"]["attributes"] == {"buyer": "Acme BV", "lines": 3, "po": "PO-2026-0041"}
    assert rows["plain"]["attributes"] == {}
    services.resume_due(run_id="po-41")
    detail = client.get("/api/runs/po-41/").json()
    assert detail["attributes"]["invoice"] == "INV-1" and detail["attributes"]["amount"] == 99


def test_attr_finds_runs_by_exact_value_every_one_must_match(client_for, reader, orders):
    client = client_for(reader)
    assert found(client, "?attr=po:PO-2026-0041") == ["po-41"]
    assert found(client, "?attr=buyer:Acme BV") == ["po-41", "po-42"]
    assert found(client, "?attr=buyer:Acme%20BV&attr=po:PO-2026-0042") == ["po-42"]
    assert found(client, "?attr=buyer:Acme%20BV&attr=po:PO-2026-0043") == []
    assert found(client, "?attr=po:PO-2026-004") == []  # exact, not a prefix
    assert found(client, "?attr=po:po-2026-0041") == []  # exact, case included
    assert found(client, "?attr=lines:3") == ["po-41", "po-42"]  # an integer by its decimal text
    assert found(client, "?attr=lines:0&status=pending") == ["po-43"]
    assert found(client, "?attr=buyer:Acme BV&workflow=waiting") == []
    assert found(client, "?attr=po:a:b") == []  # the value is everything after the first colon
    assert found(client, "?attr=invoice:") == []


@pytest.mark.parametrize(
    "query",
    [
        "?attr=po",
        "?attr=:PO-1",
        "?attr=not a name:x",
        "?attr=" + "n" * 51 + ":x",
        "?attr=po:ok&attr=nocolon",
        "?attr=po:" + "x" * 201,
    ],
)
def test_a_malformed_attr_is_a_400(client_for, reader, orders, query):
    response = client_for(reader).get(f"/api/runs/{query}")
    assert response.status_code == 400, response.content
    assert "attr" in response.content.decode()


def test_a_start_whose_attribute_cannot_be_read_is_a_400_recording_nothing(client_for, starter):
    response = client_for(starter).post(
        "/api/runs/",
        {"workflow": "attributed_order", "input": {"buyer": {"name": "Acme"}}, "run_id": "po-x"},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert "'po'" in response.json()["detail"]
    assert not RunState.objects.filter(pk="po-x").exists() and not RunAttribute.objects.exists()

    response = client_for(starter).post(
        "/api/runs/", {"workflow": "attributed_order", "input": order_input("PO-API")}, format="json"
    )
    assert response.status_code == 201, response.content
    assert response.json()["attributes"]["po"] == "PO-API"


def test_a_scoped_workflows_runs_are_not_found_by_their_attributes(client_for, settings, superuser, orders):
    settings.DURABLERUNS_WORKFLOW_GROUPS = {"attributed_order": ["Purchasing"]}
    outside = user_with("outside", *READ)
    inside = user_with("inside", *READ)
    inside.groups.add(Group.objects.create(name="Purchasing"))
    assert found(client_for(outside), "?attr=po:PO-2026-0041") == []
    assert found(client_for(outside), "?attr=buyer:Acme BV") == []
    assert found(client_for(inside), "?attr=po:PO-2026-0041") == ["po-41"]
    assert found(client_for(superuser), "?attr=buyer:Acme BV") == ["po-41", "po-42"]
