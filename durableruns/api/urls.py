"""The REST API's routes (filled in by the back-office work)."""

from __future__ import annotations

urlpatterns: list = []
