"""The URLs the documentation's build mounts the app at, as the install section does: the API under /api/."""

from django.urls import include, path

urlpatterns = [path("api/", include("durableruns.api.urls"))]
