"""The inbox through the API (durableruns.inbox): the open approvals and escalations a person may take and decide,
the overdue first; taking and releasing one. Deciding stays where it was (runs/{id}/decide/, escalations/{id}/
decide/), now refused to anyone but the item's holder."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema_field
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from durableruns import inbox, services
from durableruns.api.permissions import CanUseInbox
from durableruns.api.serializers import ErrorSerializer
from durableruns.api.views import BAD_QUERY, NOT_ALLOWED, NOT_AUTHENTICATED, DurableRunsAPIView, document, parse
from durableruns.clock import Clock
from durableruns.models import InboxItem


class HolderSerializer(serializers.Serializer):
    """Who holds an item, and since when (the database's clock)."""

    by = serializers.CharField()
    since = serializers.DateTimeField()


class InboxItemSerializer(serializers.ModelSerializer):
    """An approval or escalation as work for people: whose it is, who has it, when it is due."""

    run_id = serializers.CharField(read_only=True)
    workflow = serializers.CharField(source="run.workflow", read_only=True)
    attributes = serializers.SerializerMethodField(help_text="The run's attributes, name -> string or integer.")
    assigned_to = serializers.SerializerMethodField(
        help_text="The group the item is assigned to; null: everyone who may decide it."
    )
    holder = serializers.SerializerMethodField()
    overdue = serializers.SerializerMethodField(help_text="Whether its due time has passed (the database's clock).")
    escalation_id = serializers.IntegerField(read_only=True, allow_null=True)

    class Meta:
        model = InboxItem
        fields = [
            "id",
            "kind",
            "run_id",
            "workflow",
            "attributes",
            "step",
            "attempt",
            "escalation_id",
            "assigned_to",
            "holder",
            "opened_at",
            "due_at",
            "overdue",
            "escalate_to",
            "escalate_at",
            "reminded_at",
            "moved_at",
        ]
        read_only_fields = fields

    def get_attributes(self, item: InboxItem) -> dict[str, str | int]:
        return services.attributes_of(item.run)

    def get_assigned_to(self, item: InboxItem) -> str | None:
        return item.group or None

    @extend_schema_field(HolderSerializer(allow_null=True))
    def get_holder(self, item: InboxItem) -> dict[str, Any] | None:
        if not item.claimed_by:
            return None
        return {"by": item.claimed_by, "since": serializers.DateTimeField().to_representation(item.claimed_at)}

    def get_overdue(self, item: InboxItem) -> bool:
        now = self.context.get("now")
        return bool(item.due_at is not None and now is not None and item.due_at <= now)


class InboxFilterSerializer(serializers.Serializer):
    mine = serializers.BooleanField(
        required=False,
        default=False,
        help_text="1: only the items assigned to you or your groups (or to nobody in particular) that nobody "
        "else holds.",
    )


class TakenSerializer(ErrorSerializer):
    """`taken`: another person holds the item: who, and since when."""

    item_id = serializers.IntegerField(required=False)
    held_by = serializers.CharField(required=False)
    held_since = serializers.DateTimeField(required=False)


NOT_FOUND = OpenApiResponse(
    ErrorSerializer,
    description="No open item with that id that you may see (inbox_item_not_found): decided, of a run out of your "
    "scope, or of a kind you may not decide.",
)
ITEM = OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH, description="The inbox item.")


@document(
    get=dict(
        summary="List the inbox: open approvals and escalations, the overdue first, then by due time",
        parameters=[InboxFilterSerializer],
        responses={200: InboxItemSerializer(many=True), 400: BAD_QUERY, 401: NOT_AUTHENTICATED, 403: NOT_ALLOWED},
    ),
)
class InboxList(DurableRunsAPIView, generics.ListAPIView):
    """GET the open items the caller may decide (durableruns.decide_approval, durableruns.decide_escalation) of
    the runs in their scope; ?mine=1 those assigned to them or their groups, unclaimed or claimed by them."""

    needs = (CanUseInbox,)
    serializer_class = InboxItemSerializer

    def get_queryset(self) -> Any:
        mine = parse(InboxFilterSerializer, self.request.query_params)["mine"]
        return inbox.items(self.request.user, mine=mine).prefetch_related("run__attributes")

    def cursor_ordering(self, request: Request) -> tuple[str, ...]:
        return ("due_key", "opened_at", "id")

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "now": Clock().now()}


def _act(summary: str) -> dict[str, Any]:
    return dict(
        summary=summary,
        request=None,
        parameters=[ITEM],
        responses={
            200: InboxItemSerializer,
            401: NOT_AUTHENTICATED,
            403: OpenApiResponse(
                ErrorSerializer,
                description="Without the permission to decide the item's kind, or not a member of the group it "
                "is assigned to (not_assigned).",
            ),
            404: NOT_FOUND,
            409: OpenApiResponse(TakenSerializer, description="Another person holds it (taken): who, since when."),
        },
    )


class _ItemAct(DurableRunsAPIView):
    """One act on an inbox item: `act` is the service (inbox.take or inbox.release), the answer the item as the
    caller now sees it."""

    needs = (CanUseInbox,)
    pagination_class = None
    serializer_class = InboxItemSerializer
    act: Callable[..., InboxItem]

    def post(self, request: Request, id: int) -> Response:
        item = type(self).act(id, user=request.user)
        fresh = inbox.items(request.user).filter(pk=item.pk).first() or item
        return Response(InboxItemSerializer(fresh, context={"now": Clock().now()}).data)


@document(post=_act("Take an inbox item: only you decide it until you release it"))
class ClaimItem(_ItemAct):
    """POST to take the item (a recorded staff act); 409 naming the holder if someone else has it."""

    act = staticmethod(inbox.take)


@document(post=_act("Release an inbox item you hold, for someone else to take"))
class ReleaseItem(_ItemAct):
    """POST to give the item back (a recorded staff act); only its holder, or a superuser, may."""

    act = staticmethod(inbox.release)
