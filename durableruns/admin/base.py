"""What every page of the back office shares: read-only admins, change lists that prefetch what their rows
need, and a paginator that stops counting.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import SEARCH_VAR, ChangeList
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property

# -- change lists that prefetch what their rows need ---------------------------------------------------------


class RunChangeList(ChangeList):
    """Prefetch the attempts and the attributes of the runs on the page in two queries: each row's sentence needs
    its boundary, its attributes column the attributes."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = self.result_list.with_attempts().prefetch_related("attributes")


class EscalationChangeList(ChangeList):
    """Prefetch the attempts of every run on the queue's page in one query: sentence, holds and counts."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = self.result_list.prefetch_related("run__attempts")




class ReadOnlyRecord(admin.ModelAdmin):
    """The record is written by workers and services only: no admin form adds, edits or deletes a row."""

    # PostgreSQL refuses a NUL in text, so a NUL in what staff ask for could only end in a server error. A filter
    # holding one is refused as Django refuses any lookup it cannot use (back to the list, ?e=1); Django's search
    # form already drops such a search term; an address holding one names no record.

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        if any("\x00" in key or any("\x00" in value for value in values)
               for key, values in request.GET.lists() if key != SEARCH_VAR):
            raise IncorrectLookupParameters("a filter holds a NUL character")
        return super().get_changelist_instance(request)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        if "\x00" in object_id:
            return None
        return super().get_object(request, object_id, from_field)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False




class CappedCountPaginator(Paginator):
    """Counts up to CAP rows past which the list says "more than": a COUNT(*) over a million runs reads every
    index entry at each page view, while a count that stops at CAP + 1 costs at most that. Pages past the cap are
    not offered (an offset that deep reads as many rows anyway); a filter or a search narrows the list instead."""

    CAP = 10_000

    @cached_property
    def count(self) -> int:
        object_list = self.object_list
        if isinstance(object_list, QuerySet):
            return object_list[: self.CAP + 1].count()
        return min(len(object_list), self.CAP + 1)

    @property
    def capped(self) -> bool:
        return self.count > self.CAP
