"""The runs' pages: the list with its filters, a run's page with its boundary, holdings and family, the two
confirmed staff actions, and the approval queue.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.timesince import timesince

from durableruns import bulks, scopes, services
from durableruns.admin import bulks as bulk_pages
from durableruns.admin.base import CappedCountPaginator, ReadOnlyRecord, RunChangeList
from durableruns.admin.display import (
    CANCELLABLE,
    RETRYABLE,
    attempt_row,
    attributes_html,
    badge,
    boundary_sentence,
    family,
    holding_rows,
    holds,
    pretty_json,
    row_boundary,
    run_url,
    status_badge,
    summarize,
    zone_badge,
    zone_detail,
)
from durableruns.admin.drawing import plan_drawing
from durableruns.admin.forms import ApprovalForm, NoteForm
from durableruns.admin.live import live_context, live_view
from durableruns.admin.restarts import restart_context, restart_url, restart_view
from durableruns.boundary import Zone
from durableruns.errors import DurableRunsError
from durableruns.models import (
    Intervention,
    RunPlan,
    RunState,
    RunStep,
)
from durableruns.querysets import RunStateQuerySet

CANCEL_QUESTION = "Cancel these runs for good? A worker holding one is fenced out; nothing already done is undone."
RETRY_QUESTION = ("Give the failed step of these runs a fresh set of attempts? The next resume_runs makes a new "
                  "attempt under the same effect key.")

# A run's input longer than this many lines (as indented JSON) is folded on its page, as the results are.
INPUT_SHOWN_LINES = 20


class PlanFilter(admin.SimpleListFilter):
    """Runs by the plan they follow, each plan with how many unfinished runs it still has: what a deploy must keep
    the steps of until they drain. Plans with none left are not listed."""

    title = "plan (unfinished runs)"
    parameter_name = "plan"
    UNRECORDED = "unrecorded"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        plans = RunPlan.objects.in_flight().order_by("workflow", "-first_seen")
        return [*((p.fingerprint, f"{p.workflow} {p.fingerprint} ({p.active_runs} unfinished)") for p in plans),
                (self.UNRECORDED, "not recorded")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value == self.UNRECORDED:
            return cast(RunStateQuerySet, queryset).with_unrecorded_plan()
        if value:
            return cast(RunStateQuerySet, queryset).of_plan(value)
        return queryset


class WaitingForFilter(admin.SimpleListFilter):
    """Runs waiting at a wait step (a sleep, a wait for an event, an approval), by the step's name."""

    title = "waiting for"
    parameter_name = "waiting_for"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, f"{name} ({kind})") for name, kind in services.wait_steps()]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return cast(RunStateQuerySet, queryset).waiting_for(value) if value else queryset




class WorkflowFilter(admin.SimpleListFilter):
    """Runs by workflow, the choices read one index probe per workflow (Django's own filter on a field reads
    SELECT DISTINCT over every run kept)."""

    title = "workflow"
    parameter_name = "workflow__exact"  # the address Django's own filter on the field used

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        hidden = scopes.hidden_workflows(request.user)
        return [(name, name) for name in RunState.objects.workflow_names() if name not in hidden]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return queryset.filter(workflow=value) if value else queryset




@admin.register(RunState)
class RunStateAdmin(ReadOnlyRecord):
    """Runs, newest first, each with the sentence that says where it stands; read-only, two confirmed actions."""

    list_display = ("run_id", "workflow", "status_badge", "where_it_stands", "attributes_column", "owner",
                    "lease_expires_at", "age", "wake_at")
    list_filter = ("status", WorkflowFilter, PlanFilter, WaitingForFilter)
    search_fields = ("run_id",)
    search_help_text = ("A run id (or its beginning), an exact effect key such as <run id>:charge, or an "
                        "attribute's exact value, such as an order number.")
    ordering = ("-created_at",)
    list_per_page = 100
    show_full_result_count = False  # run_state grows without bound: one COUNT per page is enough
    paginator = CappedCountPaginator  # and that one stops at CAP
    actions = ("cancel_runs", "retry_runs", "restart_failed_runs", "adopt_plan_runs")
    change_list_template = "durableruns/admin/run_change_list.html"
    change_form_template = "durableruns/admin/run_change_form.html"
    fieldsets = (
        (None, {"fields": (("run_id", "workflow"), ("status_badge", "cursor"), "reason")}),
        ("Ownership", {"fields": (("owner", "epoch"), ("lease_expires_at", "wake_at"))}),
        ("Queue and limit", {"fields": (("queue", "priority"), "concurrency_key")}),
        ("Attributes", {"fields": ("attributes_shown",)}),
        ("Record", {"fields": (("created_at", "updated_at"), "plan_fingerprint", "input_json")}),
    )

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Whoever may act on runs (cancel, retry, decide their escalations) must be able to see them.
        return (super().has_view_permission(request, obj) or self.has_cancel_permission(request)
                or self.has_retry_permission(request) or request.user.has_perm("durableruns.decide_escalation")
                or self.has_adopt_plan_permission(request) or request.user.has_perm("durableruns.restart_run"))

    def has_adopt_plan_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("durableruns.adopt_plan")

    def has_decide_approval_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("durableruns.decide_approval")

    def get_urls(self) -> list[Any]:
        approvals = path("approvals/", self.admin_site.admin_view(self.approvals_view),
                         name="durableruns_approvals")
        restart = path("restart/<str:step>/<path:object_id>/", self.admin_site.admin_view(
            services.non_atomic_requests(lambda request, **kw: restart_view(self, request, **kw))),
            name="durableruns_runstate_restart")
        live = path("<path:object_id>/live/", self.admin_site.admin_view(lambda request, object_id: live_view(
            self, request, object_id)), name="durableruns_runstate_live")
        bulk = path("bulk/<str:bulk_id>/", self.admin_site.admin_view(lambda request, bulk_id: bulk_pages.progress_view(
            self, request, bulk_id)), name="durableruns_bulk_progress")
        return [approvals, restart, bulk, live, *super().get_urls()]

    # -- the approval queue: runs waiting for a person's yes or no, beside the escalation queue

    @services.non_atomic_requests  # a decision is its own durable transaction
    def approvals_view(self, request: HttpRequest) -> HttpResponse:
        """The open approvals, oldest first, each with the run's input, its results so far and the approval's
        doc; staff with durableruns.decide_approval approve or reject each (services.decide, recorded once)."""
        can_decide = self.has_decide_approval_permission(request)
        if not (self.has_view_permission(request) or can_decide):
            raise PermissionDenied
        if request.method == "POST":
            if not can_decide:
                raise PermissionDenied
            form = ApprovalForm(request.POST)
            if form.is_valid() and not self.get_queryset(request).filter(pk=form.cleaned_data["run_id"]).exists():
                # a run out of the user's scope is not there for them: nothing recorded, nothing said of it
                self.message_user(request, f"Nothing was recorded: no run {form.cleaned_data['run_id']!r} awaits "
                                           f"an approval.", messages.ERROR)
            elif form.is_valid():
                data = form.cleaned_data
                try:
                    services.decide(data["run_id"], data["step"], data["outcome"], by=request.user,
                                    note=data["note"])
                except DurableRunsError as exc:  # AlreadyDecided, ApprovalNotFound: nothing recorded
                    self.message_user(request, f"Nothing was recorded: {exc}", messages.ERROR)
                else:
                    self.message_user(request, f"Recorded “{data['outcome']}” for {data['step']} of "
                                               f"{data['run_id']}; the run goes on at once.", messages.SUCCESS)
            else:
                self.message_user(request, "Nothing was recorded: a rejection needs a note saying why.",
                                  messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())
        rows = []
        only = request.GET.get("run")  # the inbox opens one run's approval
        for attempt in services.open_approvals(user=request.user):
            if only and attempt.run_id != only:
                continue
            run = attempt.run
            boundary = row_boundary(run)
            until = (attempt.progress or {}).get("until")
            rows.append({
                "run": run, "run_url": run_url(run.run_id), "status": status_badge(run.status),
                "step": attempt.step, "since": attempt.started_at, "sentence": boundary_sentence(boundary),
                "until": datetime.fromisoformat(until) if isinstance(until, str) else None,
                "doc": inspect.cleandoc(services.step_doc(run, attempt.step)),
                "input_json": pretty_json(run.input), "results": holds(boundary),
                "form": ApprovalForm(initial={"run_id": run.run_id, "step": attempt.step}) if can_decide else None,
            })
        context = {**self.admin_site.each_context(request), "opts": self.opts, "title": "Approval queue",
                   "subtitle": None, "approvals": rows, "can_decide": can_decide}
        return TemplateResponse(request, "durableruns/admin/approval_queue.html", context)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("durableruns.cancel_run")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("durableruns.retry_run")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return flatten_fieldsets(self.fieldsets)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # Every list, search, count, action and page of runs reads through here: a run out of the user's scope
        # (DURABLERUNS_WORKFLOW_GROUPS) is in none of them, and its page is Django's "does not exist".
        return cast(RunStateQuerySet, super().get_queryset(request)).visible_to(request.user)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RunChangeList

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str
                           ) -> tuple[QuerySet, bool]:
        """Match runs whose id begins with the term, that made an attempt under it as an effect key ('which run
        charged under this key?'), or that have an attribute of any name whose value is exactly the term ('the
        run of PO-2026-0041').

        Both are index reads whatever the record's size: the id's beginning by the primary key's pattern index
        (a match anywhere in the id, Django's default, reads every run), the effect key by run_step's index, read
        first so that the runs' filter is two index conditions the database can combine, not a subquery tried
        against every run; the attributes likewise, by run_attribute's value index."""
        term = search_term.strip()
        if not term:
            return queryset, False
        keyed = cast(RunStateQuerySet, queryset).having_effect_key_ids(term)
        attributed = services.attribute_value_run_ids(term)  # an attribute's exact value, of any name
        return queryset.filter(Q(run_id__startswith=term) | Q(run_id__in=keyed) | Q(run_id__in=attributed)), False

    # The staff actions (cancel, retry) post here: each service call records its fact in its own durable
    # transaction, which cannot nest inside the request's own under ATOMIC_REQUESTS.
    @services.non_atomic_requests
    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return super().changelist_view(request, {"title": "Runs", **(extra_context or {})})

    # -- columns

    @admin.display(description="status", ordering="status")
    def status_badge(self, run: RunState) -> SafeString:
        return status_badge(run.status)

    @admin.display(description="where it stands")
    def where_it_stands(self, run: RunState) -> SafeString:
        boundary = row_boundary(run)
        sentence = boundary_sentence(boundary)
        outlived = services.outlived_timeout(run, boundary, now=timezone.now())
        if outlived:
            return format_html('{}<div class="dr-why"><strong>{}</strong></div>', sentence, outlived)
        if run.ending:
            return format_html('{}<div class="dr-why"><strong>ending unfinished: gives back what it holds, then '
                               '{}</strong></div>', sentence, run.ending)
        if not run.reason:
            return format_html("{}", sentence)
        return format_html('{}<div class="dr-why">{}</div>', sentence, Truncator(run.reason).chars(160))

    @admin.display(description="attributes")
    def attributes_column(self, run: RunState) -> SafeString:
        """The run's attributes, compact: name=value, a long value cut short (the run page shows them whole)."""
        return attributes_html(services.attributes_of(run), compact=True)

    @admin.display(description="attributes")
    def attributes_shown(self, run: RunState) -> SafeString:
        return attributes_html(services.attributes_of(run), compact=False)

    @admin.display(description="age", ordering="created_at")
    def age(self, run: RunState) -> str:
        return timesince(run.created_at)

    @admin.display(description="input")
    def input_json(self, run: RunState) -> SafeString:
        """The input, shown whole when short; a long one folded as the results are, its summary on the fold."""
        shown = pretty_json(run.input)
        lines = shown.count("\n") + 1
        if lines <= INPUT_SHOWN_LINES:
            return format_html('<pre class="dr-json">{}</pre>', shown)
        return format_html('<details class="dr-input"><summary>{} ({} lines)</summary><pre class="dr-json">{}</pre>'
                           '</details>', summarize(run.input), lines, shown)

    # -- the run page

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], add: bool = False,
                           change: bool = False, form_url: str = "", obj: RunState | None = None) -> HttpResponse:
        if obj is not None:
            context.update(self.run_page_context(request, obj))
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)

    def run_page_context(self, request: HttpRequest, run: RunState) -> dict[str, Any]:
        """The boundary in plan order, every attempt of every step, decisions and escalations: four queries."""
        rows = list(RunStep.objects.of_run(run.run_id))
        boundary = services.boundary_of(run, rows)
        by_step: dict[str, list[RunStep]] = {}
        for row in sorted(rows, key=lambda r: r.attempt):
            by_step.setdefault(row.step, []).append(row)
        escalations = list(run.escalations.select_related("decision").order_by("opened_at"))
        open_by_step = {e.step: e for e in escalations if e.is_open}
        steps = []
        for name in (*boundary.plan, *(s for s in by_step if s not in boundary.plan)):
            zone = boundary.zone(name) if name in boundary.plan else None
            latest = boundary.latest.get(name)
            policy = services.step_policy(run, name)
            steps.append({
                "name": name,
                "badge": zone_badge(zone) if zone else badge("not in the run's plan", "muted"),
                "detail": zone_detail(zone, latest) if zone else "attempted under the plan it had before",
                "policy": policy.value if policy else "unknown",
                "escalation": open_by_step.get(name) if zone is Zone.IN_DOUBT else None,
                "attempts": [attempt_row(r) for r in by_step.get(name, [])],
                "restart_url": restart_url(run.run_id, name) if name in boundary.plan else "",
            })
        outlived = services.outlived_timeout(run, boundary, now=timezone.now())
        return {
            "sentence": f"{boundary_sentence(boundary)}. {outlived}" if outlived else boundary_sentence(boundary),
            "steps": steps,
            "attempt_count": len(rows),
            "holdings": holding_rows(run, rows),
            "ending": run.ending,
            "escalations": escalations,
            "interventions": list(run.interventions.all()),
            "events": [{"sent_at": e.sent_at, "event": e.event, "key": e.key, "json": pretty_json(e.payload),
                        "consumed_at": e.consumed_at, "consumed_step": e.consumed_step,
                        "consumed_attempt": e.consumed_attempt} for e in run.events.order_by("sent_at", "id")],
            **family(run, request.user),
            **plan_drawing(run, rows, boundary, request.user),
            **restart_context(run, request.user),
            "can_cancel": self.has_cancel_permission(request) and run.status in CANCELLABLE,
            "can_retry": self.has_retry_permission(request) and run.status in RETRYABLE,
            # Staff who may not decide still read an escalation: the link says "read it", not "decide it".
            "can_decide": request.user.has_perm("durableruns.decide_escalation"),
            # Where a step raised (error_detail) is for staff who may view runs, not for everyone who may act.
            "can_see_traceback": request.user.has_perm("durableruns.view_runstate"),
            **live_context(run, rows),
        }

    # -- staff actions, each confirmed with a note and recorded by a service

    @admin.action(description="Cancel selected runs…", permissions=["cancel"])
    def cancel_runs(self, request: HttpRequest, queryset: RunStateQuerySet) -> HttpResponse | None:
        if bulk_pages.selected_across(request):  # "select all N": a bulk the workers act on, not this request
            return bulk_pages.confirm_bulk(self, request, queryset, action="cancel", name="cancel_runs",
                                           title="Cancel runs in bulk", question=CANCEL_QUESTION)
        return self._confirmed(
            request, queryset, action="cancel_runs", perform=services.cancel_run,
            title="Cancel runs", verb="cancelled",
            question=CANCEL_QUESTION,
        )

    @admin.action(description="Retry selected failed runs…", permissions=["retry"])
    def retry_runs(self, request: HttpRequest, queryset: RunStateQuerySet) -> HttpResponse | None:
        if bulk_pages.selected_across(request):
            return bulk_pages.confirm_bulk(self, request, queryset, action="retry", name="retry_runs",
                                           title="Retry failed runs in bulk", question=RETRY_QUESTION)
        return self._confirmed(
            request, queryset, action="retry_runs", perform=services.retry_run,
            title="Retry failed runs", verb="retried",
            question=RETRY_QUESTION,
        )

    @admin.action(description="Restart selected failed runs from the failed step…", permissions=["restart"])
    def restart_failed_runs(self, request: HttpRequest, queryset: RunStateQuerySet) -> HttpResponse | None:
        """Always a bulk: each run restarted (durableruns.restart) from the step it failed at, by the workers."""
        return bulk_pages.confirm_bulk(
            self, request, queryset, action="restart", name="restart_failed_runs", from_step=bulks.FAILED_STEP,
            title="Restart failed runs from the failed step",
            question="Restart each of these failed runs from the step it failed at? Each becomes a new run of the "
                     "same input under this deploy's plan, the steps before copied, every effect key kept (a "
                     "resolvable step is looked up by its key first). A run that is not failed is skipped.")

    def has_restart_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("durableruns.restart_run")

    @admin.action(description="Move selected runs to the current plan…", permissions=["adopt_plan"])
    def adopt_plan_runs(self, request: HttpRequest, queryset: RunStateQuerySet) -> HttpResponse | None:
        return self._confirmed(
            request, queryset, action="adopt_plan_runs", perform=services.adopt_plan,
            title="Move runs to the current plan", verb="moved to the current plan",
            question="Move these runs to this deploy's plan of their workflow? Only a run whose record fits it "
                     "moves (every step it attempted is in the new plan, in the same order, with the same "
                     "policy, and none it has not attempted comes before them); any other is left as it is.",
        )

    def _confirmed(self, request: HttpRequest, queryset: RunStateQuerySet, *, action: str, title: str, verb: str,
                   question: str, perform: Callable[..., Intervention]) -> HttpResponse | None:
        """Like delete_selected: a confirmation page with a required note, then one service call per run."""
        runs = list(queryset.with_attempts())
        form = NoteForm(request.POST if request.POST.get("post") else None)
        if form.is_valid():
            done = []
            for run in runs:
                try:
                    perform(run.run_id, by=request.user, note=form.cleaned_data["note"])
                except DurableRunsError as exc:  # RunNotActionable, RunNotFound: nothing changed for this run
                    self.message_user(request, f"{run.run_id} was not {verb}: {exc}", messages.ERROR)
                else:
                    done.append(run.run_id)
            if done:
                self.message_user(request, f"{verb.capitalize()} {len(done)} run(s): {', '.join(done)}. "
                                           f"Recorded with your note.", messages.SUCCESS)
            return None  # back to the runs list
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "subtitle": None,
            "question": question,
            "opts": self.opts,
            "action": action,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "form": form,
            "runs": [{"run": r, "badge": status_badge(r.status), "sentence": boundary_sentence(row_boundary(r))}
                     for r in runs],
            "media": self.media,
        }
        return TemplateResponse(request, "durableruns/admin/run_action_confirmation.html", context)
