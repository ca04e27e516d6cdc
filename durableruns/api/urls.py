"""The REST API's routes, mounted under /api/ by the site, and its OpenAPI schema at /api/schema/.

No Swagger UI here: drf-spectacular's loads its assets from a CDN unless the site installs
drf-spectacular-sidecar, which the app does not require. The demo site serves one from the sidecar, behind the
same authentication as the schema (see project/urls.py).
"""

from __future__ import annotations

from typing import Any

from django.urls import URLPattern, path, register_converter
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularAPIView

from durableruns import conf
from durableruns.api import bulks, inbox, streams, views
from durableruns.version import __version__


class RunIdConverter:
    """Any run_id a client may choose (':', '-', '/', unicode), but never NUL, which PostgreSQL cannot hold."""

    regex = "[^\x00]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(RunIdConverter, "run_id")


class AppSchemaGenerator(SchemaGenerator):
    """Document the app's own endpoints only, wherever the site mounts them: the site's other views are the
    site's to document, under its own schema settings."""

    def _initialise_endpoints(self) -> None:
        super()._initialise_endpoints()
        self.endpoints = [
            endpoint
            for endpoint in self.endpoints
            if getattr(endpoint[3], "cls", None) is not None
            and endpoint[3].cls.__module__.startswith("durableruns.api.")
        ]


@extend_schema(exclude=True)
class SchemaView(SpectacularAPIView):
    """The OpenAPI document, for signed-in callers like the rest of the API (it names the deploy's workflows);
    left out of the document itself. Its title and version are the app's; the site's SPECTACULAR_SETTINGS
    still apply to everything else."""

    generator_class = AppSchemaGenerator
    schema = views.AppSchema()
    versioning_class = None
    custom_settings = {
        "TITLE": "durableruns API",
        "DESCRIPTION": "Start durable runs, read their recovery boundary, decide escalated steps.",
        "VERSION": __version__,
    }

    def get(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        # Not drf-spectacular's annotated `get`: its annotation builds on the site's DEFAULT_SCHEMA_CLASS, and on
        # a site that leaves DRF's own there, documenting this very view would fail (the schema a 500).
        return super().get(request, *args, **kwargs)

    def get_authenticators(self) -> list[Any]:
        return [cls() for cls in conf.api_authentication_classes()]

    def get_permissions(self) -> list[Any]:
        return [cls() for cls in conf.api_permission_classes()]

    def get_exception_handler(self) -> Any:
        return conf.api_exception_handler()


app_name = "durableruns-api"

urlpatterns: list[URLPattern] = [
    path("runs/", views.RunList.as_view(), name="run-list"),
    # before the run's own paths: "bulk" is the bulk acts' (a run whose id begins "bulk/" is not read through here)
    path("runs/bulk/", bulks.StartBulk.as_view(), name="run-bulk"),
    path("runs/bulk/<str:bulk_id>/", bulks.BulkProgress.as_view(), name="run-bulk-progress"),
    # before the detail: a run_id may contain "/", so the detail's pattern would match these paths too
    path("runs/<run_id:run_id>/cancel/", views.CancelRun.as_view(), name="run-cancel"),
    path("runs/<run_id:run_id>/retry/", views.RetryRun.as_view(), name="run-retry"),
    path("runs/<run_id:run_id>/restart/", views.RestartRun.as_view(), name="run-restart"),
    path("runs/<run_id:run_id>/adopt_plan/", views.AdoptPlan.as_view(), name="run-adopt-plan"),
    path("runs/<run_id:run_id>/events/", views.SendEvent.as_view(), name="run-events"),
    path("runs/<run_id:run_id>/decide/", views.DecideApproval.as_view(), name="run-decide"),
    path("runs/<run_id:run_id>/events-stream/", streams.RunEventsStream.as_view(), name="run-events-stream"),
    path("runs/<run_id:run_id>/", views.RunDetail.as_view(), name="run-detail"),
    path("escalations/", views.EscalationList.as_view(), name="escalation-list"),
    path("escalations/<int:id>/decide/", views.DecideEscalation.as_view(), name="escalation-decide"),
    path("inbox/", inbox.InboxList.as_view(), name="inbox-list"),
    path("inbox/<int:id>/claim/", inbox.ClaimItem.as_view(), name="inbox-claim"),
    path("inbox/<int:id>/release/", inbox.ReleaseItem.as_view(), name="inbox-release"),
    path("schema/", SchemaView.as_view(), name="schema"),
]
