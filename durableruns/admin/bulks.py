"""The back office's bulk acts (issue 32): the runs list's cancel, retry and restart on every run matching its
filters ("select all N"), and the escalation queue's one decision for the selected escalations, each recorded as
a bulk (durableruns.bulks) that the workers act on outside the request; then the bulk's progress page, which
refreshes itself until the bulk has finished.

Kept apart from the runs' and the escalations' pages: each of those calls one function here.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from durableruns import bulks
from durableruns.admin.forms import NoteForm
from durableruns.bulk_models import Bulk
from durableruns.errors import DurableRunsError
from durableruns.policies import Outcome

# The runs list's filters a bulk checks again per run, by the names GET /api/runs/ gives them. The plan filter
# and the search box choose the runs when the bulk is made; they have no name in the API's filter.
LIST_FILTERS = {"status__exact": "status", "workflow__exact": "workflow", "waiting_for": "waiting_for"}
# How often the progress page reloads itself while the bulk runs.
REFRESH_SECONDS = 2


def list_filter(request: HttpRequest) -> dict[str, Any]:
    """The runs list's filters of this request (its query string), as GET /api/runs/ names them."""
    return {api: request.GET[name] for name, api in LIST_FILTERS.items() if request.GET.get(name)}


def progress_url(bulk_id: str) -> str:
    return reverse("admin:durableruns_bulk_progress", kwargs={"bulk_id": bulk_id})


def selected_across(request: HttpRequest) -> bool:
    """Whether the action was asked for every run matching the list's filters (Django's "select all N")."""
    return request.POST.get("select_across") == "1"


def confirm_bulk(model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet, *, action: str,
                 name: str, title: str, question: str, from_step: str | None = None) -> HttpResponse:
    """A confirmation page with a required note; once confirmed, record the bulk (nothing is acted on in this
    request) and go to its progress page."""
    form = NoteForm(request.POST if request.POST.get("post") else None)
    if form.is_valid():
        try:
            bulk_id, _total = bulks.start_bulk(action, list_filter(request), by=request.user,
                                               note=form.cleaned_data["note"], from_step=from_step, chosen=queryset)
        except DurableRunsError as exc:
            form.add_error("note", f"Nothing was recorded: {exc}")
        else:
            return HttpResponseRedirect(progress_url(bulk_id))
    context = {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "subtitle": None,
        "question": question,
        "opts": model_admin.opts,
        "action": name,
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
        "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
        "select_across": selected_across(request),
        "count": queryset.count(),
        "filters": list_filter(request),
        "form": form,
        "media": model_admin.media,
    }
    return TemplateResponse(request, "durableruns/admin/bulk_confirmation.html", context)


class BulkDecisionForm(forms.Form):
    """One outcome and one note for every selected escalation."""

    outcome = forms.ChoiceField(choices=[(o.value, o.value.replace("_", " ")) for o in Outcome], label="decision")
    note = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 70}),
        help_text="What you checked and what you found: recorded on each escalation with your name and the time.",
    )


def decide_escalations(model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
    """The escalation queue's bulk decision: one outcome and note for the selected escalations, recorded as a
    bulk the workers decide, each escalation once (one decided meanwhile is skipped with who decided it)."""
    form = BulkDecisionForm(request.POST if request.POST.get("post") else None)
    ids = list(queryset.values_list("pk", flat=True))
    if form.is_valid():
        try:
            bulk_id, _total = bulks.decide_in_bulk(ids, form.cleaned_data["outcome"], by=request.user,
                                                   note=form.cleaned_data["note"])
        except DurableRunsError as exc:
            form.add_error("note", f"Nothing was recorded: {exc}")
        else:
            return HttpResponseRedirect(progress_url(bulk_id))
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Decide escalations in bulk",
        "subtitle": None,
        "question": "Decide every selected escalation the same way? Workers record one decision each, outside "
                    "this request; one decided meanwhile is left as it was decided.",
        "opts": model_admin.opts,
        "action": "decide_in_bulk",
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
        "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
        "select_across": selected_across(request),
        "count": len(ids),
        "filters": {},
        "form": form,
        "media": model_admin.media,
    }
    return TemplateResponse(request, "durableruns/admin/bulk_confirmation.html", context)


def progress_view(model_admin: admin.ModelAdmin, request: HttpRequest, bulk_id: str) -> HttpResponse:
    """A bulk's state, done of total, and the runs skipped with their reasons (those the user may see); the page
    reloads itself every REFRESH_SECONDS while the bulk runs."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    try:
        progress = bulks.progress(bulk_id, user=request.user)
    except DurableRunsError:
        raise PermissionDenied from None  # no such bulk: nothing said of it
    bulk: Bulk = progress.bulk
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"Bulk {bulk.get_action_display()}: {progress.state}",
        "subtitle": None,
        "opts": model_admin.opts,
        "bulk": bulk,
        "progress": progress,
        "percent": 100 if not progress.total else round(100 * progress.done / progress.total),
        "refresh": REFRESH_SECONDS if progress.state == "running" else None,
        "media": model_admin.media,
    }
    return TemplateResponse(request, "durableruns/admin/bulk_progress.html", context)
