"""The served OpenAPI schema describes the API, and fuzzing the app against it (schemathesis, in-process over
WSGI, as a superuser) finds no server error."""

from __future__ import annotations

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, Phase, given, settings
from rest_framework.authtoken.models import Token
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from durableruns import bulks
from durableruns.api import streams
from durableruns.models import RunState
from durableruns.registry import workflows
from tests.api.conftest import escalated_run
from tests.factories import complete, make_run

pytestmark = pytest.mark.django_db(transaction=True)

OPERATIONS = {
    ("GET", "/api/runs/"),
    ("POST", "/api/runs/"),
    ("GET", "/api/runs/{run_id}/"),
    ("GET", "/api/escalations/"),
    ("POST", "/api/escalations/{id}/decide/"),
    ("POST", "/api/runs/{run_id}/cancel/"),
    ("POST", "/api/runs/{run_id}/retry/"),
    ("POST", "/api/runs/{run_id}/restart/"),
    ("POST", "/api/runs/{run_id}/adopt_plan/"),
    ("POST", "/api/runs/{run_id}/events/"),
    ("POST", "/api/runs/{run_id}/decide/"),
    ("GET", "/api/runs/{run_id}/events-stream/"),
    ("GET", "/api/inbox/"),
    ("POST", "/api/inbox/{id}/claim/"),
    ("POST", "/api/inbox/{id}/release/"),
    ("POST", "/api/runs/bulk/"),
    ("GET", "/api/runs/bulk/{bulk_id}/"),
}
EXAMPLES = 30  # per operation and pass: about 330 requests
# Its only input is a free-form string in the path: every value is valid, so there is no invalid request to make.
NOTHING_TO_NEGATE = {"GET /api/runs/{run_id}/", "GET /api/runs/bulk/{bulk_id}/"}


def test_the_schema_is_served_to_signed_in_callers_and_names_every_operation(anonymous, client_for, reader):
    assert anonymous.get("/api/schema/").status_code == 401
    response = client_for(reader).get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    served = {(method.upper(), path) for path, item in schema["paths"].items() for method in item}
    assert served == OPERATIONS
    decide = schema["paths"]["/api/escalations/{id}/decide/"]["post"]
    assert set(decide["responses"]) == {"200", "400", "401", "403", "404", "409"}
    start = schema["components"]["schemas"]["StartRun"]
    assert start["required"] == ["input", "workflow"] and start["properties"]["input"]["type"] == "object"
    assert {"cookieAuth", "tokenAuth"} <= set(schema["components"]["securitySchemes"])
    # the two status vocabularies are named by the app, not by the site's ENUM_NAME_OVERRIDES
    components = schema["components"]["schemas"]
    assert components["Run"]["properties"]["status"]["allOf"][0]["$ref"].endswith("/RunStatusEnum")
    assert components["Attempt"]["properties"]["status"]["allOf"][0]["$ref"].endswith("/StepStatusEnum")
    assert "needs_decision" in components["RunStatusEnum"]["enum"]
    # pages are cursors: no count
    page = components["PaginatedRunList"]["properties"]
    assert set(page) == {"next", "previous", "results"}
    assert schema["info"]["title"] == "durableruns API"
    # the workflows this deploy runs are listed, read from the registry when the schema is served
    [ref] = start["properties"]["workflow"]["allOf"]  # drf-spectacular moves enums into components
    workflow = schema["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]
    assert {"order", "scripted", "purchase_order"} <= set(workflow["enum"])
    # ...but not an internal one: no caller of the API may start the Tasks backend's workflow
    assert "durableruns.task" in workflows() and "durableruns.task" not in workflow["enum"]


def test_fuzzing_every_operation_finds_no_server_error(superuser, monkeypatch):
    make_run(run_id="po-1")
    complete("po-1", "first", {"ok": 1})
    escalation = escalated_run(run_id="po-2")
    ended = make_run(run_id="po-3")
    RunState.objects.filter(pk=ended).update(status="completed")
    bulk_id, _ = bulks.start_bulk("cancel", {"run_id": "po-1"}, by=superuser, note="fuzzed")
    monkeypatch.setattr(streams, "STREAM_SECONDS", 0.5)  # a stream of a run that goes on ends soon all the same
    token = Token.objects.create(user=superuser)
    schema = schemathesis.openapi.from_wsgi(
        "/api/schema/?format=json", get_wsgi_application(), headers={"Authorization": f"Token {token.key}"}
    )
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {(op.method.upper(), op.path) for op in operations} == OPERATIONS
    # Generated path parameters rarely name a row; a second pass pins them to seeded rows so that GETs and
    # decisions reach the database and the services, not only the 404s.
    real_rows = {
        "/api/runs/{run_id}/": {"run_id": "po-2"},
        "/api/escalations/{id}/decide/": {"id": escalation.pk},
        "/api/runs/{run_id}/events-stream/": {"run_id": "po-3"},
        "/api/runs/bulk/{bulk_id}/": {"bulk_id": bulk_id},
    }
    statuses: dict[str, set[int]] = {}

    for operation in operations:
        label = f"{operation.method.upper()} {operation.path}"
        seen = statuses.setdefault(label, set())
        passes = [(GenerationMode.POSITIVE, None)]
        if label not in NOTHING_TO_NEGATE:
            passes.append((GenerationMode.NEGATIVE, None))
        if operation.path in real_rows:
            passes.append((GenerationMode.POSITIVE, real_rows[operation.path]))
        for mode, path_parameters in passes:

            @given(case=operation.as_strategy(generation_mode=mode, path_parameters=path_parameters))
            @settings(
                max_examples=EXAMPLES,
                derandomize=True,
                deadline=None,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def call(case: schemathesis.Case) -> None:
                response = case.call(headers={"Authorization": f"Token {token.key}"})
                seen.add(response.status_code)  # noqa: B023  (called within this iteration)
                case.validate_response(response, checks=[not_a_server_error])

            call()

    # The fuzzing reached the application's successes, not only its refusals.
    assert 200 in statuses["GET /api/runs/"] and 201 in statuses["POST /api/runs/"]
    assert 200 in statuses["GET /api/runs/{run_id}/"] and 200 in statuses["GET /api/escalations/"]
    assert {200, 409} <= statuses["POST /api/escalations/{id}/decide/"]  # decided once, then refused
    assert 200 in statuses["GET /api/runs/{run_id}/events-stream/"]
    assert 200 in statuses["GET /api/runs/bulk/{bulk_id}/"] and 400 in statuses["POST /api/runs/bulk/"]
    assert RunState.objects.count() > 2
