"""The schedules' page: each declared schedule with its last slot and next run.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from durableruns import schedules, scopes
from durableruns.admin.base import ReadOnlyRecord
from durableruns.models import (
    ScheduleState,
)

# -- schedules ---------------------------------------------------------------------------------------------


@admin.register(ScheduleState)
class ScheduleAdmin(ReadOnlyRecord):
    """Schedules as the record knows them (a worker records one the first time it sees it), each with its
    declaration in this deploy, the last slot started and the next one; read-only."""

    list_display = ("name", "workflow", "cron", "time_zone", "catch_up", "last_slot_started", "next_slot", "trouble")
    search_fields = ("name",)
    fields = ("name", "workflow", "cron", "time_zone", "catch_up", "last_slot_started", "next_slot", "trouble",
              "runs", "created_at")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # a schedule starts runs of one workflow: out of the user's scope, it is not on their page
        hidden = scopes.hidden_workflows(request.user)
        names = sorted(s.name for s in schedules.schedules() if s.workflow in hidden)
        queryset = super().get_queryset(request)
        return queryset.exclude(name__in=names) if names else queryset

    @staticmethod
    def _declared(obj: ScheduleState) -> schedules.Schedule | None:
        return schedules.get_schedule(obj.name)

    @admin.display(description="workflow")
    def workflow(self, obj: ScheduleState) -> str:
        declared = self._declared(obj)
        return declared.workflow if declared else "not declared in this deploy"

    @admin.display(description="cron")
    def cron(self, obj: ScheduleState) -> str:
        declared = self._declared(obj)
        return declared.cron if declared else "-"

    @admin.display(description="time zone")
    def time_zone(self, obj: ScheduleState) -> str:
        declared = self._declared(obj)
        return declared.timezone if declared else "-"

    @admin.display(description="catch up")
    def catch_up(self, obj: ScheduleState) -> str:
        declared = self._declared(obj)
        return declared.catch_up if declared else "-"

    @admin.display(description="last slot started", ordering="last_slot")
    def last_slot_started(self, obj: ScheduleState) -> str:
        return schedules.slot_text(schedules.aware(obj.last_slot)) if obj.last_slot else "none yet"

    @admin.display(description="next slot")
    def next_slot(self, obj: ScheduleState) -> str:
        """The first slot after the last one started (or after a worker first saw it): due once it has come."""
        declared = self._declared(obj)
        if declared is None:
            return "-"
        return schedules.slot_text(declared.next_slot(schedules.aware(obj.last_slot or obj.created_at)))

    @admin.display(description="trouble")
    def trouble(self, obj: ScheduleState) -> str:
        """Why no slot of it starts, where its workflow refuses its input (the workers skip it): else blank."""
        declared = self._declared(obj)
        refused = schedules.input_refused(declared) if declared else None
        return f"no slot starts: {refused}" if refused else ""

    @admin.display(description="runs")
    def runs(self, obj: ScheduleState) -> SafeString:
        url = reverse("admin:durableruns_runstate_changelist") + "?" + urlencode({"q": f"{obj.name}@"})
        return format_html('<a href="{}">runs of {}</a>', url, obj.name)
