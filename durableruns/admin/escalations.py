"""The escalation queue: the steps in doubt that staff settle, each decision one services call.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import F, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.timesince import timesince

from durableruns import services
from durableruns.admin.base import EscalationChangeList, ReadOnlyRecord
from durableruns.admin.bulks import decide_escalations
from durableruns.admin.display import (
    attempt_row,
    badge,
    boundary_sentence,
    holding_rows,
    holds,
    pretty_json,
    row_boundary,
    run_url,
    status_badge,
    when,
)
from durableruns.admin.forms import DECISION_LABELS, DecisionForm
from durableruns.errors import AlreadyDecided, DurableRunsError
from durableruns.models import (
    Escalation,
    RunStatus,
    RunStep,
)
from durableruns.querysets import EscalationQuerySet

# -- the escalation queue ------------------------------------------------------------------------------------


class DecisionStateFilter(admin.SimpleListFilter):
    """Open escalations by default: the queue. Decided ones stay one click away, with their decision."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("open", "open"), ("decided", "decided"), ("all", "all")]

    def choices(self, changelist: ChangeList) -> Iterator[Any]:
        current = self.value() or "open"
        for value, label in self.lookup_choices:
            yield {"selected": current == value, "display": label,
                   "query_string": changelist.get_query_string({self.parameter_name: value})}

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        state = self.value() or "open"
        if state == "open":
            return cast(EscalationQuerySet, queryset).open()
        if state == "decided":
            return cast(EscalationQuerySet, queryset).decided()
        return queryset


@admin.register(Escalation)
class EscalationAdmin(ReadOnlyRecord):
    """The queue of in-doubt steps a person must decide, each row carrying what deciding needs."""

    # Few, dense columns, so a row fits a laptop screen: the escalation's cell carries its decision, and the
    # step in doubt (since when, its effect key, attempts so far) shares one cell.
    list_display = ("escalation", "run_and_sentence", "in_doubt", "how_to_check", "the_run_holds")
    list_display_links = ("escalation",)
    list_filter = (DecisionStateFilter,)
    search_fields = ("run__run_id", "effect_key", "step")
    search_help_text = "A run id, an effect key or a step name."
    list_per_page = 50
    actions = ("decide_in_bulk",)
    change_list_template = "durableruns/admin/escalation_change_list.html"
    page_template = "durableruns/admin/escalation_page.html"

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or self.has_decide_permission(request)

    def has_decide_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("durableruns.decide_escalation")

    @admin.action(description="Decide selected escalations in bulk…", permissions=["decide"])
    def decide_in_bulk(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        """One outcome and note for the selected escalations, decided by the workers (admin.bulks)."""
        return decide_escalations(self, request, queryset)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # the queue, its counts and each escalation's page: only the runs the user may see (durableruns.scopes)
        mine = cast(EscalationQuerySet, super().get_queryset(request)).visible_to(request.user)
        return services.with_hold_lapses(mine.select_related("run", "decision"))

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return EscalationChangeList

    def get_ordering(self, request: HttpRequest) -> tuple[Any, ...]:
        """Open ones whose holds lapse soonest first (what waiting costs), then oldest first (the longest wait);
        decided ones latest decision first."""
        if request.GET.get(DecisionStateFilter.parameter_name) == "decided":
            return ("-decision__decided_at",)
        return (F("hold_lapses_at").asc(nulls_last=True), "opened_at")

    @services.non_atomic_requests  # the bulk decision records its bulk in a durable transaction of its own
    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return super().changelist_view(request, {"title": "Escalation queue",
                                                 "can_decide": self.has_decide_permission(request),
                                                 **(extra_context or {})})

    # -- columns: everything a person needs to decide, without opening anything else

    @admin.display(description="escalation", ordering="opened_at")
    def escalation(self, e: Escalation) -> SafeString:
        return format_html('#{} {}<div class="dr-why">opened {}</div>', e.pk, self.decision_display(e),
                           when(e.opened_at))

    @admin.display(description="run")
    def run_and_sentence(self, e: Escalation) -> SafeString:
        return format_html('<a href="{}">{}</a> {}<div class="dr-why">{}</div>', run_url(e.run_id), e.run_id,
                           status_badge(e.run.status), boundary_sentence(row_boundary(e.run)))

    @admin.display(description="in doubt", ordering="in_doubt_since")
    def in_doubt(self, e: Escalation) -> SafeString:
        attempts = sum(1 for a in e.run.attempts.all() if a.step == e.step)
        return format_html(
            '<b>{}</b> since {}<div class="dr-why">{} ago · {} attempt{} so far</div>'
            '<div class="dr-why">effect key <code>{}</code></div>',
            e.step, when(e.in_doubt_since), timesince(e.in_doubt_since), attempts, "" if attempts == 1 else "s",
            e.effect_key or "—",
        )

    @admin.display(description="the far system, and how to check it by hand")
    def how_to_check(self, e: Escalation) -> SafeString:
        doc = " ".join(services.step_doc(e.run, e.step).split())
        return format_html('<div class="dr-doc">{}</div>', doc or "The step has no docstring to say how.")

    @admin.display(description="the run holds meanwhile", ordering="hold_lapses_at")
    def the_run_holds(self, e: Escalation) -> SafeString:
        held = holding_rows(e.run, e.run.attempts.all())
        if not held:
            return format_html('<span class="dr-why">{}</span>', "nothing in another system")
        items = ((badge("lapsed" if h["lapsed"] else "lapses soon", "alert") if h["lapsing"] else "", h["step"],
                  h["line"], h["summary"]) for h in held)
        return format_html('<ul class="dr-holds">{}</ul>', format_html_join(
            "", '<li>{}<b>{}</b> {}<div class="dr-why">{}</div></li>', items))

    @staticmethod
    def decision_display(e: Escalation) -> SafeString:
        decision = getattr(e, "decision", None)
        if decision is None:
            return badge("open", "alert")
        return format_html('{}<div class="dr-why dr-decision">by {} at {}: {}</div>',
                           badge(decision.get_action_display(), "ok"), decision.decided_by,
                           when(decision.decided_at), Truncator(decision.note).chars(120))

    # -- the escalation page: read everything, decide once

    @services.non_atomic_requests  # a decision is its own durable transaction (see changelist_view of runs)
    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """Show the escalation; on POST (decide permission only) record one decision through the service."""
        escalation = self.get_object(request, unquote(object_id))
        if escalation is None:
            self.message_user(request, f"There is no escalation #{unquote(object_id)}.", messages.WARNING)
            return HttpResponseRedirect(reverse("admin:durableruns_escalation_changelist"))
        if not self.has_view_permission(request, escalation):
            raise PermissionDenied
        form = None
        if request.method == "POST":
            if not self.has_decide_permission(request):
                raise PermissionDenied
            form = DecisionForm(request.POST)
            if form.is_valid():
                response = self._decide(request, escalation, form)
                if response is not None:
                    return response
        elif self.awaits_decision(escalation) and self.has_decide_permission(request):
            form = DecisionForm()
        return TemplateResponse(request, self.page_template, self.page_context(request, escalation, form))

    @staticmethod
    def awaits_decision(escalation: Escalation) -> bool:
        """Open, and its run still stopped for it (a run cancelled meanwhile leaves nothing to decide)."""
        return escalation.is_open and escalation.run.status == RunStatus.NEEDS_DECISION

    def _decide(self, request: HttpRequest, escalation: Escalation, form: DecisionForm) -> HttpResponse | None:
        data = form.cleaned_data
        try:
            decision = services.resolve_escalation(escalation.pk, data["outcome"], by=request.user,
                                                   note=data["note"], result=data["result"])
        except AlreadyDecided as exc:
            # Someone decided first (perhaps a moment ago): theirs applies; say whose it is.
            self.message_user(request, f"Your decision was not recorded: this escalation was {exc}.",
                              messages.ERROR)
            return HttpResponseRedirect(request.path)
        except DurableRunsError as exc:  # InvalidDecision, ResultNotJSON, RunNotActionable: nothing recorded
            form.add_error(None, f"Nothing was recorded: {exc}")
            return None
        self.message_user(
            request,
            f"Recorded “{decision.get_action_display()}” for {escalation.step} of {escalation.run_id}; "
            f"the next resume_runs acts on it.",
            messages.SUCCESS,
        )
        return HttpResponseRedirect(reverse("admin:durableruns_escalation_changelist"))

    def page_context(self, request: HttpRequest, escalation: Escalation, form: DecisionForm | None
                     ) -> dict[str, Any]:
        run = escalation.run
        rows = list(RunStep.objects.of_run(run.run_id))
        boundary = services.boundary_of(run, rows)
        decision = getattr(escalation, "decision", None)
        policy = services.step_policy(run, escalation.step)
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"{escalation.step} of {run.run_id}: " + ("decided" if decision else "in doubt"),
            "subtitle": None,
            "escalation": escalation,
            "run": run,
            "run_url": run_url(run.run_id),
            "status": status_badge(run.status),
            "sentence": boundary_sentence(boundary),
            "policy": policy.value if policy else "unknown",
            "doc": inspect.cleandoc(services.step_doc(run, escalation.step)),
            "attempts": [attempt_row(r) for r in sorted(rows, key=lambda r: r.attempt)
                         if r.step == escalation.step],
            "holds": holds(boundary),
            "holdings": holding_rows(run, rows),
            "remainder": [s for s in boundary.remainder if s != escalation.step],
            "input_json": pretty_json(run.input),
            "decision": decision,
            "decision_result_json": pretty_json(decision.result) if decision and decision.result is not None else "",
            "form": form,
            "labels": [(o.value, label) for o, label in DECISION_LABELS.items()],
            "has_view_permission": True,
        }
