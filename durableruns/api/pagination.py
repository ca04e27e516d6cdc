"""Pages of the runs list and the escalation queue: a cursor over a unique order, never a COUNT(*).

Both tables only grow, so an offset page costs a scan of every row before it and a count costs a scan of all;
a cursor costs one indexed range read whatever the page. Each list names its order; the last column is unique,
so rows that share a timestamp are never skipped or repeated between pages.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request

from durableruns import conf


class KeysetPagination(CursorPagination):
    """DRF's cursor pagination, ordered by the view's `cursor_ordering(request)`, sized by the app's setting."""

    ordering = ("-created_at", "-pk")

    def get_page_size(self, request: Request) -> int:
        return conf.api_page_size()

    def get_ordering(self, request: Request, queryset: QuerySet[Any], view: Any) -> tuple[str, ...]:
        ordering = getattr(view, "cursor_ordering", None)
        return tuple(ordering(request)) if ordering else tuple(self.ordering)
