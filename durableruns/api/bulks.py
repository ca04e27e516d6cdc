"""The API's bulk acts (issue 32): POST /api/runs/bulk/ records one act for every run a filter matches and answers
202 at once; GET /api/runs/bulk/{bulk_id}/ says how far the workers are (durableruns.bulks)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import status
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from durableruns import bulks
from durableruns.api import requests as r
from durableruns.api.permissions import CanActInBulk, CanViewRuns
from durableruns.api.serializers import ErrorSerializer
from durableruns.api.views import (
    BAD_REQUEST,
    NOT_ALLOWED,
    NOT_AUTHENTICATED,
    DurableRunsAPIView,
    JSONBodyParser,
    document,
    parse,
)

NOT_A_BULK = OpenApiResponse(ErrorSerializer, description="No bulk act has that bulk_id (bulk_not_found).")


@document(
    post=dict(
        summary="Act on every run a filter matches: cancel, retry or restart, in bulk",
        description="Needs the single act's permission (durableruns.cancel_run, retry_run or restart_run). The "
        "runs the filter matches now, in the caller's scope, are frozen in one commit and the answer is 202 at "
        "once; the resume_runs workers act on each later, checking it against the whole filter and the act's "
        "precondition again (a run that no longer fits is skipped with a reason). Each act is a staff act with "
        "who, when, the note and the bulk's id.",
        request=r.BulkRequestSerializer,
        responses={
            202: r.BulkStartedSerializer,
            400: BAD_REQUEST,
            401: NOT_AUTHENTICATED,
            403: NOT_ALLOWED,
        },
    ),
)
class StartBulk(DurableRunsAPIView):
    """POST records a bulk act by filter; 202 with its id and how many runs it holds."""

    needs = (CanActInBulk,)
    pagination_class = None
    parser_classes = [JSONBodyParser]
    serializer_class = r.BulkRequestSerializer

    def post(self, request: Request) -> Response:
        body = request.data if isinstance(request.data, dict) else {}
        action = body.get("action")
        if action in bulks.ACTIONS and not request.user.has_perm(bulks.PERMISSIONS[action]):
            # the act it names needs its own permission: refused before the rest is read, nothing recorded
            raise PermissionDenied(f"A bulk {action} needs the permission {bulks.PERMISSIONS[action]}.")
        data = parse(r.BulkRequestSerializer, request.data)
        bulk_id, total = bulks.start_bulk(
            data["action"], data["filter"], by=request.user, note=data["note"], from_step=data.get("from_step")
        )
        location = request.build_absolute_uri(f"{bulk_id}/")
        return Response(
            {"bulk_id": bulk_id, "total": total}, status=status.HTTP_202_ACCEPTED, headers={"Location": location}
        )


@document(
    get=dict(
        summary="How far a bulk act is",
        description="Needs durableruns.view_runstate. `done` counts the runs taken so far, acted on or skipped; "
        "`failed` lists the skipped ones (those in your scope) with the reason.",
        parameters=[OpenApiParameter("bulk_id", OpenApiTypes.STR, OpenApiParameter.PATH, description="The bulk.")],
        responses={200: r.BulkProgressSerializer, 401: NOT_AUTHENTICATED, 403: NOT_ALLOWED, 404: NOT_A_BULK},
    ),
)
class BulkProgress(DurableRunsAPIView):
    """GET a bulk act's state, total, done and failed."""

    needs = (CanViewRuns,)
    pagination_class = None
    serializer_class = r.BulkProgressSerializer

    def get(self, request: Request, bulk_id: str) -> Response:
        progress = bulks.progress(bulk_id, user=request.user)
        body: dict[str, Any] = {
            "state": progress.state,
            "total": progress.total,
            "done": progress.done,
            "failed": [{"run_id": run_id, "reason": reason} for run_id, reason in progress.failed],
        }
        return Response(body)
