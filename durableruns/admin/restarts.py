"""A run's restart from a step in the back office: "restart from here" on each step of an ended run's page, a
confirmation page with a required note, then durableruns.restart and the new run's page; and the links between
a restarted run and the run it restarts, on both pages. Scoped: a run out of the user's scope is not there."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from durableruns import restarts
from durableruns.admin.display import boundary_sentence, row_boundary, run_url, status_badge
from durableruns.admin.forms import NoteForm
from durableruns.errors import DurableRunsError
from durableruns.models import Intervention, RunState

PERMISSION = "durableruns.restart_run"


def restart_url(run_id: str, step: str) -> str:
    return reverse("admin:durableruns_runstate_restart", args=[step, quote(run_id)])


def restart_context(run: RunState, user: Any) -> dict[str, Any]:
    """What a run's page shows of restarts: whether this user may restart it (from any step), the run it
    restarts, and the runs that restart it, each linked where the user may see it."""
    visible = RunState.objects.visible_to(user)
    source = None
    if run.restarted_from:
        seen = visible.filter(pk=run.restarted_from).exists()
        source = {"run_id": run.restarted_from, "url": run_url(run.restarted_from) if seen else "",
                  "step": run.restarted_step}
    acts = run.interventions.filter(action=Intervention.Action.RESTART).order_by("decided_at")
    made = [(a, str((a.result or {}).get("restarted_as") or "")) for a in acts]
    shown = set(visible.filter(pk__in=[new for _, new in made if new]).values_list("run_id", flat=True))
    restarted_as = [{"run_id": new, "url": run_url(new), "step": a.step, "by": a.decided_by, "at": a.decided_at}
                    for a, new in made if new in shown]
    return {"can_restart": user.has_perm(PERMISSION) and run.status in restarts.RESTARTABLE and not run.ending,
            "restarted_from": source, "restarted_as": restarted_as}


def restart_view(model_admin: ModelAdmin, request: HttpRequest, step: str, object_id: str) -> HttpResponse:
    """Confirm a restart of the run from `step` with a note; on success, the new run's page."""
    if not request.user.has_perm(PERMISSION):
        raise PermissionDenied
    run = model_admin.get_queryset(request).filter(pk=unquote(object_id)).first()
    if run is None:  # unknown, or out of the user's scope: not there for them
        raise Http404(f"no run {unquote(object_id)!r}")
    form = NoteForm(request.POST if request.method == "POST" else None)
    if form.is_valid():
        try:
            new = restarts.restart(run.run_id, step, by=request.user, note=form.cleaned_data["note"])
        except DurableRunsError as exc:  # RunNotActionable, InvalidInput: nothing recorded
            model_admin.message_user(request, f"{run.run_id} was not restarted: {exc}", messages.ERROR)
            return HttpResponseRedirect(run_url(run.run_id))
        model_admin.message_user(request, f"Restarted {run.run_id} from {step} as {new}. Recorded with your note "
                                          f"on both runs.", messages.SUCCESS)
        return HttpResponseRedirect(run_url(new))
    opts = model_admin.model._meta
    context = {
        **model_admin.admin_site.each_context(request), "title": f"Restart {run.run_id} from {step}",
        "subtitle": None, "opts": opts, "form": form, "run": run, "step": step, "run_url": run_url(run.run_id),
        "badge": status_badge(run.status), "sentence": boundary_sentence(row_boundary(run)),
        "question": f"Start a new run of {run.workflow} with this run's input, from {step}? The steps before it "
                    f"are copied with this run's results; from {step} on every step keeps this run's effect key, "
                    f"and a step that can be looked up is looked up by that key before it is called again.",
    }
    return TemplateResponse(request, "durableruns/admin/run_restart_confirmation.html", context)
