"""The demo site's purchasing app: the purchase-order workflow and the far systems it talks to."""

from __future__ import annotations

from django.apps import AppConfig


class PurchasingConfig(AppConfig):
    name = "project.purchasing"
    label = "purchasing"
    verbose_name = "Purchasing (demo)"
