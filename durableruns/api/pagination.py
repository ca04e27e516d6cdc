"""Pages of the runs list and the escalation queue: a cursor over a unique order, never a COUNT(*).

Both tables only grow, so an offset page costs a scan of every row before it and a count costs a scan of all;
a cursor costs one indexed range read whatever the page. Each list names its order; the last column is unique,
so rows that share a timestamp are never skipped or repeated between pages.

A cursor is the caller's to forge: its position must be a value of the order's first column (a time), or the
page is DRF's "Invalid cursor" (404), never a server error from a filter the database or Django cannot build.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from rest_framework.exceptions import NotFound
from rest_framework.pagination import Cursor, CursorPagination
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

    def paginate_queryset(self, queryset: QuerySet[Any], request: Request, view: Any = None) -> list[Any] | None:
        self._queryset = queryset  # decode_cursor checks the position against the column it filters
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request: Request) -> Cursor | None:
        """DRF's cursor, refused as invalid when its position is no value of the order's first column."""
        cursor = super().decode_cursor(request)
        if cursor is not None and cursor.position is not None and not self._storable(cursor.position):
            raise NotFound(self.invalid_cursor_message)
        return cursor

    def _storable(self, position: str) -> bool:
        """Whether `position` is a value of the ordering's first column that a filter can compare with: of the
        column's type, and without NUL (PostgreSQL refuses it in text)."""
        if "\x00" in position:
            return False
        column = self.ordering[0].lstrip("-")
        field = self._queryset.query.resolve_ref(column).output_field
        try:
            field.to_python(position)
        except ValidationError:
            return False
        return True
