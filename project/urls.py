"""URLs of the site that hosts durableruns: a landing page, the admin, the API and its docs.

The docs page is Swagger UI served from drf-spectacular-sidecar (no CDN), behind the same authentication as the
schema it reads: a person who is not signed in is sent to the admin's login first.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.decorators import login_required
from django.urls import include, path
from django.views.generic import TemplateView
from drf_spectacular.views import SpectacularSwaggerView
from rest_framework.permissions import IsAuthenticated

from durableruns import conf


class APIDocs(SpectacularSwaggerView):
    """Swagger UI over the app's schema, authenticated as the API is."""

    url_name = "durableruns-api:schema"
    permission_classes = [IsAuthenticated]
    authentication_classes = conf.api_authentication_classes()
    schema = None  # a page, not an endpoint: left out of the OpenAPI document


urlpatterns = [
    path("", TemplateView.as_view(template_name="landing.html"), name="landing"),
    path("admin/", admin.site.urls),
    path("api/docs/", login_required(APIDocs.as_view(), login_url="admin:login"), name="api-docs"),
    path("api/", include("durableruns.api.urls")),
    path("durableruns/", include("durableruns.ops.urls")),  # /durableruns/metrics for Prometheus
]
