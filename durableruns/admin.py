"""The back office: runs read-only with their recovery boundary, two confirmed staff actions, the escalation queue.

Pages read through the querysets and `services.boundary_of`; every write is one `services` call whose typed
error becomes a message. The record itself is never edited here: run_state has no change form, run_step (a
composite primary key, which the admin cannot register) is shown on the run page, and a decision is its own
row, made by `services.resolve_escalation`.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import flatten_fieldsets, quote, unquote
from django.contrib.admin.views.main import SEARCH_VAR, ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import F, Q, QuerySet
from django.forms.fields import InvalidJSONInput
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.timesince import timesince

from durableruns import schedules, services
from durableruns.boundary import Boundary, StepAttempt, Zone
from durableruns.errors import AlreadyDecided, DurableRunsError
from durableruns.holdings import HoldState, lapse_phrase
from durableruns.models import (
    Escalation,
    Intervention,
    RunPlan,
    RunState,
    RunStatus,
    RunStep,
    ScheduleState,
    StepStatus,
)
from durableruns.policies import Outcome
from durableruns.querysets import EscalationQuerySet, RunStateQuerySet

# -- presentation: badges and compact summaries ------------------------------------------------------------

# Tones are CSS classes of templates/durableruns/admin/styles.html. Every status and every zone has one
# (tests/admin/test_display.py checks exhaustiveness), so a new status cannot render as a blank cell.
STATUS_TONES: dict[str, str] = {
    RunStatus.PENDING: "info",
    RunStatus.RUNNING: "info",
    RunStatus.WAITING: "warn",
    RunStatus.NEEDS_DECISION: "alert",
    RunStatus.COMPLETED: "ok",
    RunStatus.FAILED: "bad",
    RunStatus.CANCELLED: "muted",
}
ZONE_BADGES: dict[Zone, tuple[str, str]] = {
    Zone.DONE: ("done", "ok"),
    Zone.IN_DOUBT: ("in doubt", "alert"),
    Zone.FAILED: ("failed", "bad"),
    Zone.WAITING: ("waiting", "warn"),
    Zone.NOT_STARTED: ("remaining", "muted"),
}
ATTEMPT_BADGES: dict[str, tuple[str, str]] = {
    StepStatus.STARTED: ("started, no outcome", "alert"),
    StepStatus.COMPLETED: ("completed", "ok"),
    StepStatus.FAILED: ("failed", "bad"),
}
# Mirrors what services.cancel_run / retry_run accept, only to decide which buttons a run page offers;
# the services still refuse anything else.
CANCELLABLE = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.NEEDS_DECISION, RunStatus.FAILED)
RETRYABLE = (RunStatus.FAILED,)


def badge(label: str, tone: str) -> SafeString:
    return format_html('<span class="dr-badge dr-{}">{}</span>', tone, label)


def status_badge(status: str) -> SafeString:
    label = RunStatus(status).label if status in RunStatus.values else status
    return badge(label, STATUS_TONES.get(status, "muted"))


def zone_badge(zone: Zone) -> SafeString:
    label, tone = ZONE_BADGES[zone]
    return badge(label, tone)


def attempt_badge(status: str) -> SafeString:
    label, tone = ATTEMPT_BADGES.get(status, (status, "muted"))
    return badge(label, tone)


def when(moment: datetime | None) -> str:
    """The moment in the site's time zone; a naive one (USE_TZ = False, refused by durableruns.E003 but a
    back office must stay readable) is the site's local time already."""
    if moment is None:
        return "—"
    return (timezone.localtime(moment) if timezone.is_aware(moment) else moment).strftime("%Y-%m-%d %H:%M:%S")


def pretty_json(value: Any) -> str:
    """Indented JSON, or a word saying the value nests too deep to show (JSON's encoders recurse per level)."""
    try:
        return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    except RecursionError:
        return f"(nested too deep to show: {nesting_depth(value)} levels)"


def _short_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and len(str(value)) <= 48


def summarize(result: Any, *, skip: Iterable[Any] = (), limit: int = 3) -> str:
    """Say what a step's result holds in a few words: its identifiers (charge_id, order_id...) if it has any."""
    if result is None:
        return "no result"
    if isinstance(result, dict):
        skipped = set(map(str, skip))
        shown = [(k, v) for k, v in result.items() if _short_scalar(v) and str(v) not in skipped]
        ids = [(k, v) for k, v in shown if k == "id" or k.endswith("_id")]
        # Without ids, references first: JSONB stores keys in its own order, not the step's.
        picked = ids or sorted(shown, key=lambda kv: "ref" not in kv[0])
        return ", ".join(f"{k} {v}" for k, v in picked[:limit]) or f"{{{len(result)} keys}}"
    if isinstance(result, list):
        return f"[{len(result)} items]"
    return str(result) if _short_scalar(result) else Truncator(str(result)).chars(48)


def holds(boundary: Boundary) -> list[dict[str, Any]]:
    """What a run holds meanwhile: each done step with a compact summary of its result (and the full JSON)."""
    out = []
    for step in boundary.done:
        latest = boundary.latest[step]
        out.append({"step": step, "summary": summarize(latest.result, skip=[latest.effect_key]),
                    "json": pretty_json(latest.result)})
    return out


# A hold that lapses within this long is flagged on the queue: waiting longer costs the run what it holds.
LAPSES_SOON = timedelta(hours=1)


def holding_rows(run: RunState, rows: Iterable[RunStep] | None = None) -> list[dict[str, Any]]:
    """What the run holds (or may hold) in other systems, each with its recorded result, since when, and when
    the far system drops it on its own: the run page, the queue and the escalation page show these."""
    now = timezone.now()
    tz = timezone.get_current_timezone()
    out = []
    for h in services.holdings_of(run, rows, held_only=True):
        left = h.lapses_in(now)
        possibly = h.state is HoldState.POSSIBLY_HELD
        line = ("possibly held: in doubt" if possibly else "held") + (
            f" since {h.since.astimezone(tz):%H:%M}" if h.since else "")
        if possibly:
            line += "; a lookup decides" if h.has_lookup else "; no lookup: check the far system by hand"
        if left is not None and not possibly:
            line += f", {lapse_phrase(left)}"
        if h.release_status == "failed":
            line += f"; its release failed ({h.release_attempts} attempt{'s' if h.release_attempts != 1 else ''})"
        elif h.release_status == "started":
            line += "; its release is in doubt"
        out.append({"step": h.step, "line": line, "summary": summarize(h.result, skip=[]),
                    "json": pretty_json(h.result), "since": h.since, "expires_at": h.expires_at,
                    "possibly": possibly, "lapsing": left is not None and left <= LAPSES_SOON,
                    "lapsed": left is not None and left <= timedelta(0)})
    return out


def zone_detail(zone: Zone, latest: StepAttempt | None) -> str:
    """Say, for one step of the plan, what its zone means for this run."""
    if zone is Zone.DONE and latest is not None:
        return f"done at {when(latest.finished_at)} (attempt {latest.attempt})"
    if zone is Zone.IN_DOUBT and latest is not None:
        return (f"in doubt since {when(latest.started_at)} (attempt {latest.attempt}): its intent was "
                f"recorded, its outcome never was")
    if zone is Zone.FAILED and latest is not None:
        error = (latest.error.strip().splitlines() or [""])[-1]
        return f"failed at {when(latest.finished_at)} (attempt {latest.attempt}): {Truncator(error).chars(160)}"
    if zone is Zone.WAITING and latest is not None:
        until = (latest.progress or {}).get("until")
        what = f" for event {latest.progress['event']!r}" if (latest.progress or {}).get("event") else ""
        deadline = f", until {when(datetime.fromisoformat(until))}" if isinstance(until, str) else ""
        return f"waiting{what} since {when(latest.started_at)}{deadline} (attempt {latest.attempt})"
    return "remaining: not started"


def _boundary(run: RunState) -> Boundary:
    """The run's boundary from its prefetched attempts, computed once per row (list cells share it)."""
    cached = run.__dict__.get("_dr_boundary")
    if cached is None:
        cached = services.boundary_of(run)
        run.__dict__["_dr_boundary"] = cached
    return cached


def _sentence(boundary: Boundary) -> str:
    return boundary.sentence(timezone.get_current_timezone())


def _run_url(run_id: str) -> str:
    return reverse("admin:durableruns_runstate_change", args=[quote(run_id)])


# The run page lists at most this many child runs (and says how many there are).
CHILDREN_SHOWN = 200


def family(run: RunState) -> dict[str, Any]:
    """The run that started `run` and the child runs it started, each linked with its status badge: two index
    reads (the primary key, and the parent index)."""
    parent = None
    if run.parent_id is not None:
        found = RunState.objects.filter(pk=run.parent_id).values("run_id", "workflow", "status").first()
        parent = (_relative(found) if found else
                  {"run_id": run.parent_id, "workflow": "", "url": "", "status": "deleted"})
    children = RunState.objects.children_of(run.run_id).values("run_id", "workflow", "status")
    shown = [_relative(row) for row in children[:CHILDREN_SHOWN]]
    count = len(shown) if len(shown) < CHILDREN_SHOWN else RunState.objects.children_of(run.run_id).count()
    return {"parent": parent, "children": shown, "children_count": count}


def _relative(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"run_id": row["run_id"], "workflow": row["workflow"], "url": _run_url(row["run_id"]),
            "status": status_badge(row["status"])}


def _escalation_url(escalation_id: int) -> str:
    return reverse("admin:durableruns_escalation_change", args=[escalation_id])


# -- forms -------------------------------------------------------------------------------------------------


class NoteForm(forms.Form):
    """The why of a staff action, recorded with the user's name and the time."""

    note = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 70}),
        help_text="Why: recorded with your name and the time, and shown on the run page.",
    )


# Deeper than this, a decision's result is refused by the form: later steps read results a few levels deep, and
# the admin must still render what was recorded (Python's JSON parser and indenting encoder recurse per level).
MAX_RESULT_DEPTH = 64


def nesting_depth(value: Any) -> int:
    """How many arrays and objects deep `value` nests (a scalar is 0), counted without recursion."""
    deepest, pending = 0, [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            pending.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend((v, depth + 1) for v in item)
        else:
            continue
        deepest = max(deepest, depth + 1)
    return deepest


class OptionalJSONField(forms.JSONField):
    """A JSON textarea that starts empty, not with the text 'null', and refuses JSON nested too deep to record.

    Django's JSONField catches only JSONDecodeError: text nested a few thousand levels makes json.loads raise
    RecursionError, a 500. Here it is a form error, and the box keeps what was typed.
    """

    default_error_messages = {
        "too_deep": f"The result is nested more than {MAX_RESULT_DEPTH} levels deep: nothing was recorded.",
    }

    def to_python(self, value: Any) -> Any:
        try:
            converted = super().to_python(value)
        except RecursionError:
            raise forms.ValidationError(self.error_messages["too_deep"], code="too_deep") from None
        if nesting_depth(converted) > MAX_RESULT_DEPTH:
            raise forms.ValidationError(self.error_messages["too_deep"], code="too_deep")
        return converted

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            bound = super().bound_data(data, initial)
        except RecursionError:
            return InvalidJSONInput(data)
        if isinstance(data, str) and nesting_depth(bound) > MAX_RESULT_DEPTH:
            return InvalidJSONInput(data)  # shown again as typed, not re-encoded
        return bound

    def prepare_value(self, value: Any) -> Any:
        return "" if value is None else super().prepare_value(value)


DECISION_LABELS = {
    Outcome.HAPPENED: "It happened",
    Outcome.DID_NOT_HAPPEN: "It did not happen — run it again",
    Outcome.ABANDON: "Abandon the run",
}


class DecisionForm(forms.Form):
    """One of three decisions (the button pressed), a required note, and for 'it happened' an optional result."""

    outcome = forms.ChoiceField(choices=[(o.value, label) for o, label in DECISION_LABELS.items()],
                                label="decision")
    note = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 70}),
        help_text="What you checked and what you found: recorded with your name and the time.",
    )
    result = OptionalJSONField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 70, "placeholder": '{"message_id": "msg_123"}'}),
        help_text="Only with “it happened”, optional: the step's result as JSON, as later steps would read it.",
        error_messages={"invalid": "The result is not valid JSON: nothing was recorded."},
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("outcome") not in (None, Outcome.HAPPENED) and data.get("result") is not None:
            self.add_error("result", "A result goes only with “it happened”.")
        return data


# -- change lists that prefetch what their rows need ---------------------------------------------------------


class RunChangeList(ChangeList):
    """Prefetch the attempts of the runs on the page in one query: each row's sentence needs its boundary."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = self.result_list.with_attempts()


class EscalationChangeList(ChangeList):
    """Prefetch the attempts of every run on the queue's page in one query: sentence, holds and counts."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = self.result_list.prefetch_related("run__attempts")


# -- runs --------------------------------------------------------------------------------------------------


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


class ApprovalForm(forms.Form):
    """Approve or reject one approval (the button pressed), with a required note."""

    run_id = forms.CharField(widget=forms.HiddenInput)
    step = forms.CharField(widget=forms.HiddenInput)
    outcome = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    note = forms.CharField(widget=forms.Textarea(attrs={"rows": 2, "cols": 50}),
                           help_text="Why: recorded with your name and the time.")


class WorkflowFilter(admin.SimpleListFilter):
    """Runs by workflow, the choices read one index probe per workflow (Django's own filter on a field reads
    SELECT DISTINCT over every run kept)."""

    title = "workflow"
    parameter_name = "workflow__exact"  # the address Django's own filter on the field used

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in RunState.objects.workflow_names()]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return queryset.filter(workflow=value) if value else queryset


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


@admin.register(RunState)
class RunStateAdmin(ReadOnlyRecord):
    """Runs, newest first, each with the sentence that says where it stands; read-only, two confirmed actions."""

    list_display = ("run_id", "workflow", "status_badge", "where_it_stands", "owner", "lease_expires_at", "age",
                    "wake_at")
    list_filter = ("status", WorkflowFilter, PlanFilter, WaitingForFilter)
    search_fields = ("run_id",)
    search_help_text = "A run id (or its beginning), or an exact effect key such as <run id>:charge."
    ordering = ("-created_at",)
    list_per_page = 100
    show_full_result_count = False  # run_state grows without bound: one COUNT per page is enough
    paginator = CappedCountPaginator  # and that one stops at CAP
    actions = ("cancel_runs", "retry_runs", "adopt_plan_runs")
    change_list_template = "durableruns/admin/run_change_list.html"
    change_form_template = "durableruns/admin/run_change_form.html"
    fieldsets = (
        (None, {"fields": (("run_id", "workflow"), ("status_badge", "cursor"), "reason")}),
        ("Ownership", {"fields": (("owner", "epoch"), ("lease_expires_at", "wake_at"))}),
        ("Queue and limit", {"fields": (("queue", "priority"), "concurrency_key")}),
        ("Record", {"fields": (("created_at", "updated_at"), "plan_fingerprint", "input_json")}),
    )

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Whoever may act on runs (cancel, retry, decide their escalations) must be able to see them.
        return (super().has_view_permission(request, obj) or self.has_cancel_permission(request)
                or self.has_retry_permission(request) or request.user.has_perm("durableruns.decide_escalation")
                or self.has_adopt_plan_permission(request))

    def has_adopt_plan_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("durableruns.adopt_plan")

    def has_decide_approval_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("durableruns.decide_approval")

    def get_urls(self) -> list[Any]:
        approvals = path("approvals/", self.admin_site.admin_view(self.approvals_view),
                         name="durableruns_approvals")
        return [approvals, *super().get_urls()]

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
            if form.is_valid():
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
                self.message_user(request, "Nothing was recorded: a note saying why is required.", messages.ERROR)
            return HttpResponseRedirect(request.path)
        rows = []
        for attempt in services.open_approvals():
            run = attempt.run
            boundary = _boundary(run)
            until = (attempt.progress or {}).get("until")
            rows.append({
                "run": run, "run_url": _run_url(run.run_id), "status": status_badge(run.status),
                "step": attempt.step, "since": attempt.started_at, "sentence": _sentence(boundary),
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

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RunChangeList

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str
                           ) -> tuple[QuerySet, bool]:
        """Match runs whose id begins with the term, or that made an attempt under it as an effect key: 'which
        run charged under this key?'.

        Both are index reads whatever the record's size: the id's beginning by the primary key's pattern index
        (a match anywhere in the id, Django's default, reads every run), the effect key by run_step's index, read
        first so that the runs' filter is two index conditions the database can combine, not a subquery tried
        against every run."""
        term = search_term.strip()
        if not term:
            return queryset, False
        keyed = cast(RunStateQuerySet, queryset).having_effect_key_ids(term)
        return queryset.filter(Q(run_id__startswith=term) | Q(run_id__in=keyed)), False

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
        boundary = _boundary(run)
        sentence = _sentence(boundary)
        outlived = services.outlived_timeout(run, boundary, now=timezone.now())
        if outlived:
            return format_html('{}<div class="dr-why"><strong>{}</strong></div>', sentence, outlived)
        if run.ending:
            return format_html('{}<div class="dr-why"><strong>ending unfinished: gives back what it holds, then '
                               '{}</strong></div>', sentence, run.ending)
        if not run.reason:
            return format_html("{}", sentence)
        return format_html('{}<div class="dr-why">{}</div>', sentence, Truncator(run.reason).chars(160))

    @admin.display(description="age", ordering="created_at")
    def age(self, run: RunState) -> str:
        return timesince(run.created_at)

    @admin.display(description="input")
    def input_json(self, run: RunState) -> SafeString:
        return format_html('<pre class="dr-json">{}</pre>', pretty_json(run.input))

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
                "attempts": [self._attempt_row(r) for r in by_step.get(name, [])],
            })
        outlived = services.outlived_timeout(run, boundary, now=timezone.now())
        return {
            "sentence": f"{_sentence(boundary)}. {outlived}" if outlived else _sentence(boundary),
            "steps": steps,
            "attempt_count": len(rows),
            "holdings": holding_rows(run, rows),
            "ending": run.ending,
            "escalations": escalations,
            "interventions": list(run.interventions.all()),
            "events": [{"sent_at": e.sent_at, "event": e.event, "key": e.key, "json": pretty_json(e.payload),
                        "consumed_at": e.consumed_at, "consumed_step": e.consumed_step,
                        "consumed_attempt": e.consumed_attempt} for e in run.events.order_by("sent_at", "id")],
            **family(run),
            "can_cancel": self.has_cancel_permission(request) and run.status in CANCELLABLE,
            "can_retry": self.has_retry_permission(request) and run.status in RETRYABLE,
            # Staff who may not decide still read an escalation: the link says "read it", not "decide it".
            "can_decide": request.user.has_perm("durableruns.decide_escalation"),
        }

    @staticmethod
    def _attempt_row(row: RunStep) -> dict[str, Any]:
        return {"row": row, "badge": attempt_badge(row.status), "has_result": row.result is not None,
                "summary": summarize(row.result, skip=[row.effect_key]), "result_json": pretty_json(row.result)}

    # -- staff actions, each confirmed with a note and recorded by a service

    @admin.action(description="Cancel selected runs…", permissions=["cancel"])
    def cancel_runs(self, request: HttpRequest, queryset: RunStateQuerySet) -> HttpResponse | None:
        return self._confirmed(
            request, queryset, action="cancel_runs", perform=services.cancel_run,
            title="Cancel runs", verb="cancelled",
            question="Cancel these runs for good? A worker holding one is fenced out; nothing already done is undone.",
        )

    @admin.action(description="Retry selected failed runs…", permissions=["retry"])
    def retry_runs(self, request: HttpRequest, queryset: RunStateQuerySet) -> HttpResponse | None:
        return self._confirmed(
            request, queryset, action="retry_runs", perform=services.retry_run,
            title="Retry failed runs", verb="retried",
            question="Give the failed step of these runs a fresh set of attempts? The next resume_runs makes a "
                     "new attempt under the same effect key.",
        )

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
            "runs": [{"run": r, "badge": status_badge(r.status), "sentence": _sentence(_boundary(r))} for r in runs],
            "media": self.media,
        }
        return TemplateResponse(request, "durableruns/admin/run_action_confirmation.html", context)


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
    actions = None
    change_list_template = "durableruns/admin/escalation_change_list.html"
    page_template = "durableruns/admin/escalation_page.html"

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or self.has_decide_permission(request)

    def has_decide_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("durableruns.decide_escalation")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return services.with_hold_lapses(super().get_queryset(request).select_related("run", "decision"))

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return EscalationChangeList

    def get_ordering(self, request: HttpRequest) -> tuple[Any, ...]:
        """Open ones whose holds lapse soonest first (what waiting costs), then oldest first (the longest wait);
        decided ones latest decision first."""
        if request.GET.get(DecisionStateFilter.parameter_name) == "decided":
            return ("-decision__decided_at",)
        return (F("hold_lapses_at").asc(nulls_last=True), "opened_at")

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
        return format_html('<a href="{}">{}</a> {}<div class="dr-why">{}</div>', _run_url(e.run_id), e.run_id,
                           status_badge(e.run.status), _sentence(_boundary(e.run)))

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
            "run_url": _run_url(run.run_id),
            "status": status_badge(run.status),
            "sentence": _sentence(boundary),
            "policy": policy.value if policy else "unknown",
            "doc": inspect.cleandoc(services.step_doc(run, escalation.step)),
            "attempts": [RunStateAdmin._attempt_row(r) for r in sorted(rows, key=lambda r: r.attempt)
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


# -- schedules ---------------------------------------------------------------------------------------------


@admin.register(ScheduleState)
class ScheduleAdmin(ReadOnlyRecord):
    """Schedules as the record knows them (a worker records one the first time it sees it), each with its
    declaration in this deploy, the last slot started and the next one; read-only."""

    list_display = ("name", "workflow", "cron", "time_zone", "catch_up", "last_slot_started", "next_slot", "trouble")
    search_fields = ("name",)
    fields = ("name", "workflow", "cron", "time_zone", "catch_up", "last_slot_started", "next_slot", "trouble",
              "runs", "created_at")

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
