"""The metrics view, for the host site to include: `path("durableruns/", include("durableruns.ops.urls"))`
serves /durableruns/metrics to staff allowed to view runs, or to a scraper with DURABLERUNS_METRICS_TOKEN."""

from __future__ import annotations

from django.urls import path

from durableruns.ops.metrics import metrics_view

urlpatterns = [path("metrics", metrics_view, name="durableruns-metrics")]
