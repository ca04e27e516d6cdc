"""The API's shapes: what a client sends (parsed here, checked by the services) and what it reads back.

Read serializers take rows whose attempts are already prefetched and compute each run's boundary once, from
those rows, so rendering a page costs no query per run.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from durableruns import services, timeline
from durableruns.api.fields import (
    ESCALATION_STATES,
    OUTCOMES,
    JSONObjectField,
    RunStatusField,
    RunStatusFieldExtension,
    StepStatusField,
    StepStatusFieldExtension,
    StorableJSONField,
    WorkflowNameField,
    WorkflowNameFieldExtension,
    unstorable_text,
)
from durableruns.api.requests import (
    ATTRIBUTES_SCHEMA,
    ApprovalDecisionSerializer,
    DecisionRequestSerializer,
    EscalationFilterSerializer,
    EventRecordedSerializer,
    EventRequestSerializer,
    EventSerializer,
    RestartedSerializer,
    RestartRequestSerializer,
    RunFilterSerializer,
    StaffNoteSerializer,
    StartRunSerializer,
)
from durableruns.boundary import Boundary, Zone
from durableruns.holdings import HoldState
from durableruns.models import Escalation, Intervention, RunState, RunStep

# The requests and fields are named here as ever (durableruns.api.requests, durableruns.api.fields).
__all__ = [
    "ATTRIBUTES_SCHEMA",
    "ApprovalDecisionSerializer",
    "DecisionRequestSerializer",
    "ESCALATION_STATES",
    "EscalationFilterSerializer",
    "EventRecordedSerializer",
    "EventRequestSerializer",
    "EventSerializer",
    "JSONObjectField",
    "OUTCOMES",
    "RestartRequestSerializer",
    "RestartedSerializer",
    "RunFilterSerializer",
    "RunStatusField",
    "RunStatusFieldExtension",
    "StaffNoteSerializer",
    "StartRunSerializer",
    "StepStatusField",
    "StepStatusFieldExtension",
    "StorableJSONField",
    "WorkflowNameField",
    "WorkflowNameFieldExtension",
    "unstorable_text",
]


def _boundary(serializer: serializers.Field, run: RunState) -> Boundary:
    """The run's boundary from its prefetched attempts, computed once per run per response."""
    cache: dict[str, Boundary] = serializer.context.setdefault("boundaries", {})
    if run.run_id not in cache:
        cache[run.run_id] = services.boundary_of(run)
    return cache[run.run_id]


def _sentence(serializer: serializers.Field, run: RunState) -> str:
    return _boundary(serializer, run).sentence(timezone.get_current_timezone())


# -- responses -----------------------------------------------------------------------------------------------


class DecisionSerializer(serializers.ModelSerializer):
    """A staff decision on an escalation: who, when, why, and the result they recorded."""

    class Meta:
        model = Intervention
        fields = ["action", "decided_by", "decided_at", "note", "result"]
        read_only_fields = fields


class InterventionSerializer(serializers.ModelSerializer):
    """Any staff act on a run (decision, cancel, retry)."""

    escalation_id = serializers.IntegerField(allow_null=True, read_only=True)

    class Meta:
        model = Intervention
        fields = ["id", "action", "step", "attempt", "decided_by", "decided_at", "note", "result", "escalation_id"]
        read_only_fields = fields


class AttemptSerializer(serializers.ModelSerializer):
    """One attempt at one step, as recorded; never edited through the API."""

    status = StepStatusField(read_only=True)

    class Meta:
        model = RunStep
        fields = [
            "step",
            "attempt",
            "status",
            "effect_key",
            "started_at",
            "finished_at",
            "owner",
            "epoch",
            "error",
            "result",
            "loop_cursor",
            "resolution",
            "error_detail",
        ]
        read_only_fields = fields
        extra_kwargs = {"error_detail": {"help_text": "The traceback's last frames: for staff users (is_staff) only."}}

    def to_representation(self, instance: RunStep) -> dict[str, Any]:
        data = super().to_representation(instance)
        request = self.context.get("request")
        if not (request is not None and getattr(request.user, "is_staff", False)):
            data.pop("error_detail", None)  # where the code raised is for staff, not for every API client
        return data


class EscalationSerializer(serializers.ModelSerializer):
    """An escalation with what a person needs to decide it: the run's sentence and the step's docstring."""

    run_id = serializers.CharField(read_only=True)
    workflow = serializers.CharField(source="run.workflow", read_only=True)
    sentence = serializers.SerializerMethodField()
    doc = serializers.SerializerMethodField(help_text="The step's docstring: how to check the far system by hand.")
    decision = serializers.SerializerMethodField()

    class Meta:
        model = Escalation
        fields = [
            "id",
            "run_id",
            "workflow",
            "step",
            "attempt",
            "effect_key",
            "in_doubt_since",
            "opened_at",
            "reason",
            "sentence",
            "doc",
            "decision",
        ]
        read_only_fields = fields

    def get_sentence(self, escalation: Escalation) -> str:
        return _sentence(self, escalation.run)

    def get_doc(self, escalation: Escalation) -> str:
        # this deploy's docstring of the step, where it declares it as the run's plan does; else ""
        return services.step_doc(escalation.run, escalation.step)

    @extend_schema_field(DecisionSerializer(allow_null=True))
    def get_decision(self, escalation: Escalation) -> dict[str, Any] | None:
        decision = getattr(escalation, "decision", None)
        return None if decision is None else DecisionSerializer(decision).data


class RunSerializer(serializers.ModelSerializer):
    """A run in a list: where it stands, in one sentence, and who holds it."""

    status = RunStatusField(read_only=True)
    sentence = serializers.SerializerMethodField(
        help_text="e.g. '6 steps complete, charge in doubt since 14:07, 3 steps remaining'"
    )
    attributes = serializers.SerializerMethodField(
        help_text="The run's attributes, name -> string or integer (Workflow(attributes=), ctx.set_attributes)."
    )

    class Meta:
        model = RunState
        fields = [
            "run_id",
            "workflow",
            "status",
            "sentence",
            "attributes",
            "cursor",
            "owner",
            "lease_expires_at",
            "wake_at",
            "deadline_at",
            "reason",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_sentence(self, run: RunState) -> str:
        return _sentence(self, run)

    @extend_schema_field(ATTRIBUTES_SCHEMA)
    def get_attributes(self, run: RunState) -> dict[str, str | int]:
        return services.attributes_of(run)


class PlanStepSerializer(serializers.Serializer):
    step = serializers.CharField()
    zone = serializers.ChoiceField(choices=[(z.value, z.value) for z in Zone])
    since = serializers.DateTimeField(allow_null=True, help_text="For an in-doubt step: when its intent was recorded.")
    attempt = serializers.IntegerField(allow_null=True, help_text="The latest attempt's number, if any.")
    policy = serializers.CharField(
        allow_null=True, help_text="The step's in-doubt policy in the run's own plan (null if it is not recorded)."
    )


class WaitingSerializer(serializers.Serializer):
    step = serializers.CharField()
    kind = serializers.ChoiceField(
        choices=[("sleep", "sleep"), ("wait_for", "wait_for"), ("approval", "approval"), ("join", "join")]
    )
    since = serializers.DateTimeField(allow_null=True, help_text="When the wait began (the database's clock).")
    until = serializers.DateTimeField(allow_null=True, help_text="Its wake time or deadline; null: none.")
    event = serializers.CharField(allow_blank=True, help_text="wait_for: the event's name.")


class BoundarySerializer(serializers.Serializer):
    plan = PlanStepSerializer(many=True)
    waiting = WaitingSerializer(many=True, help_text="Wait steps begun and not over: what the run waits for.")
    done = serializers.ListField(child=serializers.CharField())
    in_doubt = serializers.ListField(child=serializers.CharField())
    failed = serializers.ListField(child=serializers.CharField())
    remainder = serializers.ListField(child=serializers.CharField(), help_text="Every step not done, in plan order.")
    plan_known = serializers.BooleanField(
        help_text="False when the run's own plan is not recorded: `plan` is then the steps in the order attempted."
    )


class HoldingSerializer(serializers.Serializer):
    step = serializers.CharField(help_text="The acquisition: a step declared with release=.")
    state = serializers.ChoiceField(choices=[(h.value, h.value) for h in HoldState])
    result = serializers.JSONField(allow_null=True, help_text="What the acquisition recorded (its handle).")
    since = serializers.DateTimeField(allow_null=True, help_text="When it was acquired (or, in doubt, attempted).")
    expires_at = serializers.DateTimeField(
        allow_null=True, help_text="When the far system drops the hold on its own (hold_expires_after), if declared."
    )
    release_step = serializers.CharField(help_text="The step its release is recorded under.")
    release_status = serializers.CharField(
        allow_blank=True, help_text="The release's latest attempt while still held: started (in doubt) or failed."
    )


class RelativeSerializer(serializers.Serializer):
    run_id = serializers.CharField()
    workflow = serializers.CharField()
    status = serializers.CharField(help_text="pending, running, waiting, needs_decision, completed, failed, cancelled")


class ProgressSerializer(serializers.Serializer):
    """What the run's latest ctx.progress said: the step, its message, done and total, when (database clock)."""

    step = serializers.CharField()
    message = serializers.CharField()
    done = serializers.IntegerField(allow_null=True)
    total = serializers.IntegerField(allow_null=True)
    at = serializers.DateTimeField()


class RunDetailSerializer(RunSerializer):
    """A run in full: its boundary in plan order, what it holds, every attempt, its escalations and staff acts,
    the run that started it and the child runs it started."""

    parent = serializers.SerializerMethodField(help_text="The run that started this one (ctx.start_run), if any.")
    children = serializers.SerializerMethodField(help_text="The child runs this run started, by run_id.")
    boundary = serializers.SerializerMethodField()
    holdings = serializers.SerializerMethodField(
        help_text="What the run holds or may hold in other systems (held, possibly_held); empty once given back."
    )
    ending = serializers.CharField(
        read_only=True, help_text="While a run that ends unfinished gives back what it holds: the status it reaches."
    )
    escalations = EscalationSerializer(many=True, read_only=True)
    interventions = InterventionSerializer(many=True, read_only=True)
    attempts = AttemptSerializer(many=True, read_only=True)
    events = EventSerializer(many=True, read_only=True, help_text="Events sent to the run, oldest first.")
    input = JSONObjectField(read_only=True)
    progress = serializers.SerializerMethodField(help_text="The latest ctx.progress of any of its steps, or null.")

    class Meta(RunSerializer.Meta):
        fields = [
            *RunSerializer.Meta.fields,
            "plan_fingerprint",
            "epoch",
            "queue",
            "priority",
            "concurrency_key",
            "input",
            "parent",
            "children",
            "restarted_from",
            "restarted_step",
            "key_run_id",
            "boundary",
            "ending",
            "holdings",
            "escalations",
            "interventions",
            "attempts",
            "events",
            "progress",
        ]
        read_only_fields = fields

    @extend_schema_field(ProgressSerializer(allow_null=True))
    def get_progress(self, run: RunState) -> dict[str, Any] | None:
        latest = timeline.latest_of(run.attempts.all())  # prefetched: no query more
        return ProgressSerializer(latest).data if latest else None

    @extend_schema_field(RelativeSerializer(allow_null=True))
    def get_parent(self, run: RunState) -> dict[str, Any] | None:
        if run.parent_id is None:
            return None
        found = RunState.objects.filter(pk=run.parent_id).values("run_id", "workflow", "status").first()
        return RelativeSerializer(found).data if found else None

    @extend_schema_field(RelativeSerializer(many=True))
    def get_children(self, run: RunState) -> list[dict[str, Any]]:
        rows = RunState.objects.children_of(run.run_id).values("run_id", "workflow", "status")
        return list(RelativeSerializer(rows, many=True).data)

    @extend_schema_field(HoldingSerializer(many=True))
    def get_holdings(self, run: RunState) -> list[dict[str, Any]]:
        held = services.holdings_of(run, held_only=True)
        return HoldingSerializer(
            [
                {
                    "step": h.step,
                    "state": h.state.value,
                    "result": h.result,
                    "since": h.since,
                    "expires_at": h.expires_at,
                    "release_step": h.release_step,
                    "release_status": h.release_status,
                }
                for h in held
            ],
            many=True,
        ).data

    @extend_schema_field(BoundarySerializer)
    def get_boundary(self, run: RunState) -> dict[str, Any]:
        b = _boundary(self, run)
        plan = []
        for step in b.plan:
            zone = b.zone(step)
            latest = b.latest.get(step)
            policy = services.step_policy(run, step)
            plan.append(
                {
                    "step": step,
                    "zone": zone.value,
                    "since": latest.started_at if zone is Zone.IN_DOUBT and latest else None,
                    "attempt": latest.attempt if latest else None,
                    "policy": policy.value if policy else None,
                }
            )
        return BoundarySerializer(
            {
                "plan": plan,
                "waiting": [
                    {
                        "step": step,
                        "kind": kind,
                        "since": b.latest[step].started_at,
                        "until": (b.latest[step].progress or {}).get("until"),
                        "event": (b.latest[step].progress or {}).get("event") or "",
                    }
                    for step, kind in b.waiting.items()
                ],
                "done": b.done,
                "in_doubt": b.in_doubt,
                "failed": b.failed,
                "remainder": b.remainder,
                "plan_known": b.plan_known,
            }
        ).data


class ErrorSerializer(serializers.Serializer):
    """A refusal: `detail` says why. The durableruns error tree adds `code` and the facts the error carries
    (run_id, workflow, escalation_id, ...); DRF's own refusals (auth, permission, parse) carry `detail` only."""

    detail = serializers.CharField()
    code = serializers.CharField(required=False)


class ConflictSerializer(ErrorSerializer):
    """A decision that cannot apply. `already_decided` names who decided first and when; `run_not_actionable`
    carries the run's id and status."""

    escalation_id = serializers.IntegerField(required=False)
    decided_by = serializers.CharField(required=False)
    decided_at = serializers.DateTimeField(required=False)
    run_id = serializers.CharField(required=False)
    status = serializers.CharField(required=False)
    step = serializers.CharField(required=False, help_text="plan_mismatch: the step that does not fit.")
    plan = serializers.CharField(required=False, help_text="plan_mismatch: the plan the run could not adopt.")
    held_by = serializers.CharField(required=False, help_text="taken: who holds the inbox item.")
    held_since = serializers.DateTimeField(required=False, help_text="taken: since when they hold it.")
