"""The REST API's routes, mounted under /api/ by the site, and its OpenAPI schema at /api/schema/.

No Swagger UI: drf-spectacular's loads its assets from a CDN, and the sidecar package is not a dependency.
"""

from __future__ import annotations

from django.urls import URLPattern, path, register_converter
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularAPIView
from rest_framework.permissions import IsAuthenticated

from durableruns.api import views


class RunIdConverter:
    """Any run_id a client may choose (':', '-', '/', unicode), but never NUL, which PostgreSQL cannot hold."""

    regex = "[^\x00]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(RunIdConverter, "run_id")


@extend_schema(exclude=True)
class SchemaView(SpectacularAPIView):
    """The OpenAPI document, for signed-in callers like the rest of the API (it names the deploy's workflows);
    left out of the document itself."""

    permission_classes = [IsAuthenticated]

app_name = "durableruns-api"

urlpatterns: list[URLPattern] = [
    path("runs/", views.RunList.as_view(), name="run-list"),
    path("runs/<run_id:run_id>/", views.RunDetail.as_view(), name="run-detail"),
    path("escalations/", views.EscalationList.as_view(), name="escalation-list"),
    path("escalations/<int:id>/decide/", views.DecideEscalation.as_view(), name="escalation-decide"),
    path("schema/", SchemaView.as_view(), name="schema"),
]
