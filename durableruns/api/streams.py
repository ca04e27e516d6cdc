"""GET /api/runs/{run_id}/events-stream/: the run's transitions and progress as server-sent events.

Each event is an entry of durableruns.timeline (derived from the record, never an extra write on the hot path),
with its id; a client that reconnects with `Last-Event-ID` gets the entries after that id only. The stream reads
the record every POLL seconds, holding no connection and no transaction in between, so a worker killed and a new
one taking the run over are seen as any writes are. It ends after the run's end, or after STREAM_SECONDS (the
client reconnects with its Last-Event-ID; `retry:` tells it how soon). Same authentication, permissions and scope
as the run's detail: a run out of the caller's scope is a 404.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from django.db import connections
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework.exceptions import ParseError
from rest_framework.permissions import BasePermission
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request

from durableruns import conf, timeline
from durableruns.api import serializers as s
from durableruns.api.permissions import CanViewRuns
from durableruns.api.views import NOT_ALLOWED, NOT_AUTHENTICATED, DurableRunsAPIView, document
from durableruns.errors import RunNotFound
from durableruns.models import RunState

POLL = 0.5  # seconds between two reads of the record
STREAM_SECONDS = 300.0  # a stream's longest life; the client reconnects with Last-Event-ID
KEEPALIVE = 15.0  # seconds of silence before a comment line keeps proxies from closing the stream
RETRY_MS = 1000


class EventStreamRenderer(BaseRenderer):
    """Lets a client ask for text/event-stream; only a refusal (a 4xx) is rendered through it, as one event."""

    media_type = "text/event-stream"
    format = "sse"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return f"event: error\ndata: {json.dumps(data, default=str)}\n\n".encode()


def frame(entry: timeline.Entry) -> str:
    """One server-sent event: its id, its kind as the event name, its data as one line of JSON."""
    return f"id: {entry.id}\nevent: {entry.kind}\ndata: {json.dumps(entry.data, default=str)}\n\n"


def _let_go() -> None:
    """Give the connection back between two reads (not inside a transaction: a test's, or the site's)."""
    db = connections[conf.database()]
    if not db.in_atomic_block:
        db.close()


def stream(
    run_id: str, *, after: timeline.Key | None, seconds: float | None = None, poll: float = POLL
) -> Iterator[str]:
    """The events of `run_id` after `after`, as they are recorded, until the run ends or `seconds` (by default
    STREAM_SECONDS) pass."""
    seconds = STREAM_SECONDS if seconds is None else seconds
    yield f"retry: {RETRY_MS}\n\n"
    began = time.monotonic()
    spoke = began
    sent: set[timeline.Key] = set()
    while True:
        try:
            run, found = timeline.read(run_id)
        finally:
            _let_go()
        for entry in found:
            if entry.key in sent or (after is not None and entry.key <= after):
                continue
            sent.add(entry.key)
            spoke = time.monotonic()
            yield frame(entry)
        if run is None or run.status in timeline.ENDED:
            return
        now = time.monotonic()
        if now - began >= seconds:
            return
        if now - spoke >= KEEPALIVE:
            spoke = now
            yield ": keepalive\n\n"
        time.sleep(poll)


LAST_EVENT_ID = OpenApiParameter(
    "Last-Event-ID",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=False,
    description="The id of the last event received: the stream sends the events after it only.",
)


@document(
    get=dict(
        summary="The run's transitions and progress as server-sent events",
        description="text/event-stream: each event has an id, its kind as the event name (started, completed, "
        "failed, raised, progress, waiting, needs_decision, end) and its data as JSON. Resumable with "
        "Last-Event-ID; ends after the run's end, or after five minutes (reconnect with Last-Event-ID).",
        parameters=[
            OpenApiParameter("run_id", OpenApiTypes.STR, OpenApiParameter.PATH, description="The run's id."),
            LAST_EVENT_ID,
        ],
        responses={
            (200, "text/event-stream"): OpenApiResponse(OpenApiTypes.STR, description="The stream of events."),
            400: OpenApiResponse(s.ErrorSerializer, description="Last-Event-ID is not an id this stream sent."),
            401: NOT_AUTHENTICATED,
            403: NOT_ALLOWED,
            404: OpenApiResponse(s.ErrorSerializer, description="No run has that run_id (run_not_found)."),
        },
    ),
)
class RunEventsStream(DurableRunsAPIView):
    """GET the run's events as they happen (view_runstate), as a server-sent events stream."""

    needs: tuple[type[BasePermission], ...] = (CanViewRuns,)
    pagination_class = None

    def get_renderers(self) -> list[Any]:
        return [*super().get_renderers(), EventStreamRenderer()]

    def get(self, request: Request, run_id: str) -> StreamingHttpResponse:
        header = request.headers.get("Last-Event-ID", "")
        try:
            after = timeline.parse_id(header) if header.strip() else None
        except ValueError:
            raise ParseError(f"Last-Event-ID {header[:100]!r} is not an id of this stream") from None
        if not RunState.objects.visible_to(request.user).filter(pk=run_id).exists():
            raise RunNotFound(run_id=run_id)
        response = StreamingHttpResponse(stream(run_id, after=after), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # a proxy in front must pass each event on as it comes
        return response
