"""URLs of the site that hosts durableruns: the admin and the API."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("durableruns.api.urls")),
]
