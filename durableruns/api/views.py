"""The REST API's views: parse the request, make one service call, render the result.

Errors are not caught here: the core's typed errors reach `api.exceptions.exception_handler`, which answers
them. Every list prefetches the attempts its sentences need, so a page costs the same queries however many runs
or attempts exist.

Each view declares the app's own policy (authentication, permissions, renderers, pagination, the exception
handler, drf-spectacular's AutoSchema), read from durableruns' settings, never from the site's REST_FRAMEWORK:
a site that sets nothing gets a safe API, and one whose defaults differ cannot open it by accident.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import F, Prefetch
from django.http import HttpRequest, HttpResponseBase
from django.urls import reverse
from django.utils.decorators import method_decorator
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response

from durableruns import conf, restarts, scopes, services
from durableruns.api import authentication  # noqa: F401  (registers the session scheme for the schema)
from durableruns.api import serializers as s
from durableruns.api.pagination import KeysetPagination
from durableruns.api.permissions import (
    CanAdoptPlan,
    CanCancelRuns,
    CanDecideApprovals,
    CanDecideEscalations,
    CanRestartRuns,
    CanRetryRuns,
    CanSendEvents,
    CanStartRuns,
    CanViewEscalations,
    CanViewRuns,
)
from durableruns.errors import EscalationNotFound, RunNotFound
from durableruns.models import Escalation, RunEvent, RunState, RunStep
from durableruns.querysets import EscalationQuerySet, RunStateQuerySet
from durableruns.registry import startable

NOT_AUTHENTICATED = OpenApiResponse(
    s.ErrorSerializer, description="Not signed in: no session and no valid token (with a WWW-Authenticate challenge)."
)
NOT_ALLOWED = OpenApiResponse(
    s.ErrorSerializer, description="Signed in without the permission this needs (or a session write without CSRF)."
)
BAD_QUERY = OpenApiResponse(OpenApiTypes.OBJECT, description="A query parameter is invalid: errors by parameter.")
BAD_REQUEST = OpenApiResponse(
    OpenApiTypes.OBJECT,
    description="Malformed JSON, missing or invalid fields (errors by field), or a refusal of the durableruns "
    "error tree (`{detail, code}`: unknown_workflow, invalid_input, invalid_decision, result_not_json).",
)


class JSONBodyParser(JSONParser):
    """DRF's JSON parser, refusing bodies nested deeper than MAX_DEPTH with a 400.

    Python's decoder recurses, so a body of a hundred thousand '[' raises RecursionError (a 500), and a body
    just under the limit could still exhaust the stack when it is encoded again for the database.
    """

    MAX_DEPTH = 64

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None
        stack = [(data, 1)]
        while stack:
            value, depth = stack.pop()
            if depth > self.MAX_DEPTH:
                raise ParseError(f"JSON parse error - nested deeper than {self.MAX_DEPTH} levels")
            if isinstance(value, dict):
                stack.extend((v, depth + 1) for v in value.values())
            elif isinstance(value, list):
                stack.extend((v, depth + 1) for v in value)
        return data


class AppSchema:
    """drf-spectacular's AutoSchema for the app's views, a fresh inspector per view as DRF's DefaultSchema
    gives, whatever the site's DEFAULT_SCHEMA_CLASS."""

    def __get__(self, instance: Any, owner: Any) -> AutoSchema:
        inspector = AutoSchema()
        inspector.view = instance
        return inspector


class DurableRunsAPIView(generics.GenericAPIView):
    """The app's policy, declared on its views: see the module docstring and durableruns.conf."""

    schema = AppSchema()
    pagination_class: type[KeysetPagination] | None = KeysetPagination
    versioning_class = None  # the app's API has one version; a site's DEFAULT_VERSIONING_CLASS is for its own
    filter_backends = ()  # each list parses its own filters
    #: the model permissions this endpoint needs, on top of DURABLERUNS_API_PERMISSION_CLASSES
    needs: tuple[type[BasePermission], ...] = ()

    def get_authenticators(self) -> list[Any]:
        return [cls() for cls in conf.api_authentication_classes()]

    def get_permissions(self) -> list[Any]:
        return [cls() for cls in (*conf.api_permission_classes(), *self.needs)]

    def get_renderers(self) -> list[Any]:
        return [cls() for cls in conf.api_renderer_classes()]

    def get_exception_handler(self) -> Any:
        return conf.api_exception_handler()

    @method_decorator(services.non_atomic_requests)
    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        return super().dispatch(request, *args, **kwargs)


def document(**operations: dict[str, Any]) -> Any:
    """Document each method of a view: `extend_schema(methods=[...])` on the class, one per method.

    drf-spectacular's per-method annotations (extend_schema_view) build on the site's DEFAULT_SCHEMA_CLASS at
    import time; on a site that leaves DRF's own there, the document is a 500. On the class they build on the
    view's own AutoSchema.
    """

    def decorate(view: type) -> type:
        for method, kwargs in operations.items():
            view = extend_schema(methods=[method.upper()], **kwargs)(view)
        return view

    return decorate


def parse(serializer_class: type[s.serializers.Serializer], data: Any) -> dict[str, Any]:
    """Validate `data` with `serializer_class`; a ValidationError becomes a 400 naming each bad field."""
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def runs_with_attempts() -> RunStateQuerySet:
    """Runs with their attempts and their attributes in two extra queries: what a sentence and a row need."""
    return RunState.objects.with_attempts().prefetch_related("attributes")


def runs_in_full() -> RunStateQuerySet:
    """Runs with attempts (in the order made), escalations with their decisions, and staff acts."""
    attempts = Prefetch("attempts", queryset=RunStep.objects.order_by("started_at", "step", "attempt"))
    escalations = Prefetch("escalations", queryset=Escalation.objects.select_related("decision").order_by("opened_at"))
    events = Prefetch("events", queryset=RunEvent.objects.order_by("sent_at", "id"))
    # django-stubs 5.2 types prefetch_related so that no Prefetch passes (6.1's does not): the ignore is for that.
    return RunState.objects.prefetch_related(attempts, escalations, "interventions", events, "attributes")  # type: ignore[arg-type,unused-ignore]


def escalations_in_full() -> EscalationQuerySet:
    """Escalations with their run, decision and the run's attempts (for the sentence), in two queries."""
    return Escalation.objects.select_related("run", "decision").prefetch_related("run__attempts")


@document(
    get=dict(
        summary="List runs, newest first",
        description="Each run with its operator sentence and attributes. Filters: status, workflow, run_id, "
        "effect_key (runs with an attempt under that key), and attr=name:value (repeatable, all must match).",
        parameters=[s.RunFilterSerializer],
        responses={200: s.RunSerializer(many=True), 400: BAD_QUERY, 401: NOT_AUTHENTICATED, 403: NOT_ALLOWED},
    ),
    post=dict(
        summary="Start a run of a registered workflow",
        description="Record a pending run (needs durableruns.start_run); a worker's resume_runs executes it. "
        "A refusal changes nothing. With debounce_seconds and key, a start while the key's run has not begun "
        "replaces that run's input and moves its start; the answer (201) is that run.",
        request=s.StartRunSerializer,
        responses={
            201: s.RunDetailSerializer,
            400: BAD_REQUEST,
            401: NOT_AUTHENTICATED,
            403: NOT_ALLOWED,
            409: OpenApiResponse(s.ErrorSerializer, description="A run with that run_id exists (duplicate_run)."),
        },
    ),
)
class RunList(DurableRunsAPIView, generics.ListCreateAPIView):
    """GET lists runs, newest first (filters: status, workflow, effect_key, run_id, attr; durableruns.view_runstate);
    POST starts one (durableruns.start_run)."""

    needs = (CanViewRuns, CanStartRuns)
    parser_classes = [JSONBodyParser]
    serializer_class = s.RunSerializer

    def get_queryset(self) -> RunStateQuerySet:
        return runs_with_attempts().newest_first().visible_to(self.request.user)

    def cursor_ordering(self, request: Request) -> tuple[str, ...]:
        return ("-created_at", "-run_id")

    def filter_queryset(self, queryset: RunStateQuerySet) -> RunStateQuerySet:
        return queryset.matching(parse(s.RunFilterSerializer, self.request.query_params))

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = parse(s.StartRunSerializer, request.data)
        # A workflow out of the caller's scope is not there for them: refused as a name nobody declared.
        startable(data["workflow"], hidden=scopes.hidden_workflows(request.user))
        debounce = data.get("debounce_seconds")
        seconds = data.get("deadline_seconds")
        run_id = services.start_run(
            data["workflow"],
            data["input"],
            run_id=data.get("run_id"),
            debounce=None if debounce is None else timedelta(seconds=debounce),
            key=data.get("key"),
            deadline=None if seconds is None else timedelta(seconds=seconds),
        )
        run = runs_in_full().get(pk=run_id)
        location = reverse("durableruns-api:run-detail", kwargs={"run_id": run_id})
        return Response(s.RunDetailSerializer(run).data, status=status.HTTP_201_CREATED, headers={"Location": location})


@document(
    get=dict(
        summary="A run in full: boundary, sentence, attempts, escalations, interventions",
        parameters=[
            OpenApiParameter(
                "run_id",
                OpenApiTypes.STR,
                OpenApiParameter.PATH,
                description="The run's id (may contain ':', '-', '/').",
            )
        ],
        responses={
            200: s.RunDetailSerializer,
            401: NOT_AUTHENTICATED,
            403: NOT_ALLOWED,
            404: OpenApiResponse(s.ErrorSerializer, description="No run has that run_id (run_not_found)."),
        },
    ),
)
class RunDetail(DurableRunsAPIView, generics.RetrieveAPIView):
    """GET one run with everything an operator needs to know where it stands and why (view_runstate)."""

    needs: tuple[type[BasePermission], ...] = (CanViewRuns,)
    pagination_class = None
    serializer_class = s.RunDetailSerializer

    def get_queryset(self) -> RunStateQuerySet:
        return runs_in_full().visible_to(self.request.user)

    def get_object(self) -> RunState:
        run_id = self.kwargs["run_id"]
        run = self.get_queryset().filter(pk=run_id).first()
        if run is None:
            raise RunNotFound(run_id=run_id)
        return run


@document(
    get=dict(
        summary="List escalations: open ones, oldest first, by default",
        parameters=[s.EscalationFilterSerializer],
        responses={200: s.EscalationSerializer(many=True), 400: BAD_QUERY, 401: NOT_AUTHENTICATED, 403: NOT_ALLOWED},
    ),
)
class EscalationList(DurableRunsAPIView, generics.ListAPIView):
    """GET the escalation queue (durableruns.view_escalation): open ones oldest first; ?state=decided shows
    decisions, newest first; ?state=all everything, oldest first."""

    needs = (CanViewEscalations,)
    serializer_class = s.EscalationSerializer

    def get_queryset(self) -> EscalationQuerySet:
        return escalations_in_full().visible_to(self.request.user)

    def state(self) -> str:
        return str(parse(s.EscalationFilterSerializer, self.request.query_params)["state"])

    def filter_queryset(self, queryset: EscalationQuerySet) -> EscalationQuerySet:
        state = self.state()
        if state == "open":
            return queryset.open()
        if state == "decided":
            # the cursor reads its position from the row, so the decision's time is annotated onto it
            return queryset.decided().annotate(decided_at=F("decision__decided_at"))
        return queryset

    def cursor_ordering(self, request: Request) -> tuple[str, ...]:
        if self.state() == "decided":
            return ("-decided_at", "-pk")
        return ("opened_at", "pk")


@document(
    post=dict(
        summary="Decide an escalation once: it happened, it did not happen, or abandon the run",
        request=s.DecisionRequestSerializer,
        parameters=[OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH, description="The escalation.")],
        responses={
            200: s.EscalationSerializer,
            400: BAD_REQUEST,
            401: NOT_AUTHENTICATED,
            403: NOT_ALLOWED,
            404: OpenApiResponse(s.ErrorSerializer, description="No such escalation (escalation_not_found)."),
            409: OpenApiResponse(
                s.ConflictSerializer,
                description="Decided already (already_decided: names who decided first and when), taken by someone "
                "else in the inbox (taken: names who and since when), or the run "
                "no longer waits for a decision (run_not_actionable).",
            ),
        },
    ),
)
class DecideEscalation(DurableRunsAPIView):
    """POST a decision (durableruns.decide_escalation); the run becomes resumable for the next resume_runs."""

    needs = (CanDecideEscalations,)
    pagination_class = None
    parser_classes = [JSONBodyParser]
    serializer_class = s.DecisionRequestSerializer

    def post(self, request: Request, id: int) -> Response:
        data = parse(s.DecisionRequestSerializer, request.data)
        if Escalation.objects.filter(pk=id).exclude(pk__in=Escalation.objects.visible_to(request.user)).exists():
            raise EscalationNotFound(escalation_id=id)  # out of the caller's scope: not there for them
        services.resolve_escalation(id, data["outcome"], by=request.user, note=data["note"], result=data.get("result"))
        escalation = escalations_in_full().get(pk=id)
        return Response(s.EscalationSerializer(escalation).data)


def _staff_act(summary: str, needs: str, refusals: str) -> Any:
    return document(
        post=dict(
            summary=summary,
            description=f"Needs {needs}. Recorded as an intervention with who, when and the note.",
            request=s.StaffNoteSerializer,
            parameters=[
                OpenApiParameter("run_id", OpenApiTypes.STR, OpenApiParameter.PATH, description="The run's id.")
            ],
            responses={
                200: s.RunDetailSerializer,
                400: BAD_REQUEST,
                401: NOT_AUTHENTICATED,
                403: NOT_ALLOWED,
                404: OpenApiResponse(s.ErrorSerializer, description="No run has that run_id (run_not_found)."),
                409: OpenApiResponse(s.ConflictSerializer, description=refusals),
            },
        ),
        # A run_id may itself end in "/cancel" or "/retry": its GET still reads that run.
        get=dict(exclude=True),
    )


class _StaffAct(RunDetail):
    """POST a staff act on one run; a GET of the same path reads the run whose id ends with the act's name."""

    act = ""
    parser_classes = [JSONBodyParser]
    kwargs: dict[str, Any]  # the URL's, set by the view's dispatch

    def get_object(self) -> RunState:
        run_id = self.kwargs["run_id"]
        self.kwargs = {**self.kwargs, "run_id": f"{run_id}/{self.act}"}
        try:
            return super().get_object()
        finally:
            self.kwargs["run_id"] = run_id

    def perform(self, run_id: str, *, by: Any, note: str) -> None:
        raise TypeError(f"{type(self).__name__} names no act")

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        """Once the caller is authenticated and allowed: a POST on a run out of their scope is a 404, as for a
        run that does not exist, before anything is read or written (a GET reads through get_queryset)."""
        super().initial(request, *args, **kwargs)
        run_id = kwargs.get("run_id")
        if request.method == "POST" and run_id is not None:
            hidden = scopes.hidden_workflows(request.user)
            if hidden and RunState.objects.filter(pk=run_id, workflow__in=sorted(hidden)).exists():
                raise RunNotFound(run_id=run_id)

    def post(self, request: Request, run_id: str) -> Response:
        data = parse(s.StaffNoteSerializer, request.data)
        self.perform(run_id, by=request.user, note=data["note"])
        return Response(s.RunDetailSerializer(runs_in_full().get(pk=run_id)).data)


@_staff_act("Cancel a run for good", "durableruns.cancel_run", "The run has finished already (run_not_actionable).")
class CancelRun(_StaffAct):
    """POST cancels a run (durableruns.cancel_run); a worker holding it is fenced out."""

    act = "cancel"
    needs = (CanViewRuns, CanCancelRuns)

    def perform(self, run_id: str, *, by: Any, note: str) -> None:
        services.cancel_run(run_id, by=by, note=note)


@_staff_act("Retry a failed run", "durableruns.retry_run", "Only a failed run can be retried (run_not_actionable).")
class RetryRun(_StaffAct):
    """POST gives a failed run's failed step a fresh set of attempts (durableruns.retry_run)."""

    act = "retry"
    needs = (CanViewRuns, CanRetryRuns)

    def perform(self, run_id: str, *, by: Any, note: str) -> None:
        services.retry_run(run_id, by=by, note=note)


@_staff_act(
    "Move a run to the current plan",
    "durableruns.adopt_plan",
    "The run's record does not fit the current plan (plan_mismatch, naming the step), or its status does "
    "not allow it (run_not_actionable).",
)
class AdoptPlan(_StaffAct):
    """POST moves a run to this deploy's plan of its workflow, where its record fits (durableruns.adopt_plan)."""

    act = "adopt_plan"
    needs = (CanViewRuns, CanAdoptPlan)

    def perform(self, run_id: str, *, by: Any, note: str) -> None:
        services.adopt_plan(run_id, by=by, note=note)


@document(
    post=dict(
        summary="Restart an ended run from a step",
        description="Needs durableruns.restart_run. A new run of the same workflow and input under this deploy's "
        "plan: the steps before from_step copied with the source's results, every step from it on keeping the "
        "source's effect key (a resolvable step the source attempted is looked up by that key first). Recorded "
        "on both runs as an intervention with who, when and the note.",
        request=s.RestartRequestSerializer,
        parameters=[OpenApiParameter("run_id", OpenApiTypes.STR, OpenApiParameter.PATH, description="The run's id.")],
        responses={
            201: s.RestartedSerializer,
            400: BAD_REQUEST,
            401: NOT_AUTHENTICATED,
            403: NOT_ALLOWED,
            404: OpenApiResponse(s.ErrorSerializer, description="No run has that run_id (run_not_found)."),
            409: OpenApiResponse(s.ConflictSerializer, description="The run has not ended (run_not_actionable)."),
        },
    ),
    get=dict(exclude=True),
)
class RestartRun(_StaffAct):
    """POST restarts an ended run from a step (durableruns.restart); 201 with the new run's id."""

    act = "restart"
    needs = (CanViewRuns, CanRestartRuns)

    def post(self, request: Request, run_id: str) -> Response:
        data = parse(s.RestartRequestSerializer, request.data)
        new = restarts.restart(run_id, data["from_step"], by=request.user, note=data["note"])
        return Response({"run_id": new}, status=status.HTTP_201_CREATED)


@document(
    post=dict(
        summary="Send an event to a run (a partner's webhook)",
        description="Needs durableruns.send_event; token authentication works. The event is kept until a wait for "
        "its name consumes it (the oldest first, one per wait). A key the run has seen records nothing (200).",
        request=s.EventRequestSerializer,
        parameters=[OpenApiParameter("run_id", OpenApiTypes.STR, OpenApiParameter.PATH, description="The run's id.")],
        responses={
            201: s.EventRecordedSerializer,
            200: OpenApiResponse(s.EventRecordedSerializer, description="A duplicate key: nothing recorded."),
            400: BAD_REQUEST,
            401: NOT_AUTHENTICATED,
            403: NOT_ALLOWED,
            404: OpenApiResponse(s.ErrorSerializer, description="No run has that run_id (run_not_found)."),
            409: OpenApiResponse(s.ConflictSerializer, description="The run has ended (run_not_actionable)."),
        },
    ),
    get=dict(exclude=True),
)
class SendEvent(_StaffAct):
    """POST records an event for the run (durableruns.send_event)."""

    act = "events"
    needs = (CanViewRuns, CanSendEvents)

    def post(self, request: Request, run_id: str) -> Response:
        data = parse(s.EventRequestSerializer, request.data)
        recorded = services.send_event(run_id, data["event"], data.get("payload"), key=data.get("key"))
        return Response(
            {"run_id": run_id, "event": data["event"], "recorded": recorded},
            status=status.HTTP_201_CREATED if recorded else status.HTTP_200_OK,
        )


@document(
    post=dict(
        summary="Approve or reject the approval a run waits at",
        description="Needs durableruns.decide_approval. Decided once, recorded with who, when and the note.",
        request=s.ApprovalDecisionSerializer,
        parameters=[OpenApiParameter("run_id", OpenApiTypes.STR, OpenApiParameter.PATH, description="The run's id.")],
        responses={
            200: s.RunDetailSerializer,
            400: BAD_REQUEST,
            401: NOT_AUTHENTICATED,
            403: NOT_ALLOWED,
            404: OpenApiResponse(
                s.ErrorSerializer,
                description="No such run (run_not_found), or it does not wait for that approval (approval_not_found).",
            ),
            409: OpenApiResponse(
                s.ConflictSerializer,
                description="Decided already (already_decided), or taken by "
                "someone else in the inbox (taken: names who and since when).",
            ),
        },
    ),
    get=dict(exclude=True),
)
class DecideApproval(_StaffAct):
    """POST approves or rejects an approval (durableruns.decide_approval); the run goes on at once."""

    act = "decide"
    needs = (CanViewRuns, CanDecideApprovals)

    def post(self, request: Request, run_id: str) -> Response:
        data = parse(s.ApprovalDecisionSerializer, request.data)
        services.decide(run_id, data["step"], data["outcome"], by=request.user, note=data["note"])
        return Response(s.RunDetailSerializer(runs_in_full().get(pk=run_id)).data)
