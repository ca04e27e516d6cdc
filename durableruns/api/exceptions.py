"""Translate durableruns' errors into API responses in one place."""

from __future__ import annotations

from typing import Any

from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc: Exception, context: dict[str, Any]) -> Any:
    return drf_exception_handler(exc, context)
