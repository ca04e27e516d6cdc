"""The demo site's URLs plus durableruns' metrics view, included as a host site would."""

from __future__ import annotations

from django.urls import include, path

from project.urls import urlpatterns as site

urlpatterns = [*site, path("durableruns/", include("durableruns.ops.urls"))]
