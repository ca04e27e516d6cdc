"""The REST API's views: parse the request, make one service call, render the result.

Errors are not caught here: the core's typed errors reach `api.exceptions.exception_handler`, which answers
them. Every list prefetches the attempts its sentences need, so a page costs the same queries however many runs
or attempts exist.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import generics, status
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from durableruns import services
from durableruns.api import serializers as s
from durableruns.api.permissions import CanDecideEscalations, CanStartRuns
from durableruns.errors import RunNotFound
from durableruns.models import Escalation, RunState, RunStep
from durableruns.querysets import EscalationQuerySet, RunStateQuerySet

NOT_AUTHENTICATED = OpenApiResponse(s.ErrorSerializer, description="Not signed in: no session and no valid token.")
NOT_SIGNED_IN = OpenApiResponse(
    s.ErrorSerializer, description="Not signed in (DRF answers 403 when session authentication comes first)."
)
NOT_ALLOWED = OpenApiResponse(
    s.ErrorSerializer, description="Not signed in, or signed in without the permission this needs."
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


def parse(serializer_class: type[s.serializers.Serializer], data: Any) -> dict[str, Any]:
    """Validate `data` with `serializer_class`; a ValidationError becomes a 400 naming each bad field."""
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def runs_with_attempts() -> RunStateQuerySet:
    """Runs with their attempts in one extra query: what a sentence needs."""
    return RunState.objects.with_attempts()


def runs_in_full() -> RunStateQuerySet:
    """Runs with attempts (in the order made), escalations with their decisions, and staff acts."""
    attempts = RunStep.objects.order_by("started_at", "step", "attempt")
    escalations = Escalation.objects.select_related("decision").order_by("opened_at")
    return RunState.objects.prefetch_related(
        Prefetch("attempts", queryset=attempts),
        Prefetch("escalations", queryset=escalations),
        "interventions",
    )


def escalations_in_full() -> EscalationQuerySet:
    """Escalations with their run, decision and the run's attempts (for the sentence), in two queries."""
    return Escalation.objects.select_related("run", "decision").prefetch_related("run__attempts")


@extend_schema_view(
    get=extend_schema(
        summary="List runs, newest first",
        description="Each run with its operator sentence. Filters: status, workflow, run_id, and effect_key (runs "
        "with an attempt under that key).",
        parameters=[s.RunFilterSerializer],
        responses={200: s.RunSerializer(many=True), 400: BAD_QUERY, 401: NOT_AUTHENTICATED, 403: NOT_SIGNED_IN},
    ),
    post=extend_schema(
        summary="Start a run of a registered workflow",
        description="Record a pending run (needs durableruns.start_run); a worker's resume_runs executes it. "
        "A refusal changes nothing.",
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
class RunList(generics.ListCreateAPIView):
    """GET lists runs (filters: status, workflow, effect_key, run_id); POST starts one (durableruns.start_run)."""

    permission_classes = [IsAuthenticated, CanStartRuns]
    parser_classes = [JSONBodyParser]
    serializer_class = s.RunSerializer

    def get_queryset(self) -> RunStateQuerySet:
        return runs_with_attempts().newest_first()

    def filter_queryset(self, queryset: RunStateQuerySet) -> RunStateQuerySet:
        filters = parse(s.RunFilterSerializer, self.request.query_params)
        if filters.get("status"):
            queryset = queryset.filter(status=filters["status"])
        if filters.get("workflow"):
            queryset = queryset.filter(workflow=filters["workflow"])
        if filters.get("run_id"):
            queryset = queryset.filter(pk=filters["run_id"])
        if filters.get("effect_key"):
            queryset = queryset.having_effect_key(filters["effect_key"])
        return queryset

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = parse(s.StartRunSerializer, request.data)
        run_id = services.start_run(data["workflow"], data["input"], run_id=data.get("run_id"))
        run = runs_in_full().get(pk=run_id)
        location = reverse("durableruns-api:run-detail", kwargs={"run_id": run_id})
        return Response(s.RunDetailSerializer(run).data, status=status.HTTP_201_CREATED,
                        headers={"Location": location})


@extend_schema_view(
    get=extend_schema(
        summary="A run in full: boundary, sentence, attempts, escalations, interventions",
        parameters=[OpenApiParameter("run_id", OpenApiTypes.STR, OpenApiParameter.PATH,
                                     description="The run's id (may contain ':', '-', '/').")],
        responses={
            200: s.RunDetailSerializer,
            401: NOT_AUTHENTICATED,
            403: NOT_SIGNED_IN,
            404: OpenApiResponse(s.ErrorSerializer, description="No run has that run_id (run_not_found)."),
        },
    ),
)
class RunDetail(generics.RetrieveAPIView):
    """GET one run with everything an operator needs to know where it stands and why."""

    serializer_class = s.RunDetailSerializer

    def get_queryset(self) -> RunStateQuerySet:
        return runs_in_full()

    def get_object(self) -> RunState:
        run_id = self.kwargs["run_id"]
        run = self.get_queryset().filter(pk=run_id).first()
        if run is None:
            raise RunNotFound(run_id=run_id)
        return run


@extend_schema_view(
    get=extend_schema(
        summary="List escalations: open ones, oldest first, by default",
        parameters=[s.EscalationFilterSerializer],
        responses={200: s.EscalationSerializer(many=True), 400: BAD_QUERY, 401: NOT_AUTHENTICATED,
                   403: NOT_SIGNED_IN},
    ),
)
class EscalationList(generics.ListAPIView):
    """GET the escalation queue; ?state=decided shows decisions (newest first), ?state=all everything."""

    serializer_class = s.EscalationSerializer

    def get_queryset(self) -> EscalationQuerySet:
        return escalations_in_full()

    def filter_queryset(self, queryset: EscalationQuerySet) -> EscalationQuerySet:
        state = parse(s.EscalationFilterSerializer, self.request.query_params)["state"]
        if state == "open":
            return queryset.open()
        if state == "decided":
            return queryset.decided()
        return queryset.order_by("opened_at", "pk")


@extend_schema_view(
    post=extend_schema(
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
                description="Decided already (already_decided: names who decided first and when), or the run "
                "no longer waits for a decision (run_not_actionable).",
            ),
        },
    ),
)
class DecideEscalation(generics.GenericAPIView):
    """POST a decision (durableruns.decide_escalation); the run becomes resumable for the next resume_runs."""

    permission_classes = [IsAuthenticated, CanDecideEscalations]
    parser_classes = [JSONBodyParser]
    serializer_class = s.DecisionRequestSerializer

    def post(self, request: Request, id: int) -> Response:
        data = parse(s.DecisionRequestSerializer, request.data)
        services.resolve_escalation(id, data["outcome"], by=request.user, note=data["note"],
                                    result=data.get("result"))
        escalation = escalations_in_full().get(pk=id)
        return Response(s.EscalationSerializer(escalation).data)
