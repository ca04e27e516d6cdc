"""The API's shapes: what a client sends (parsed here, checked by the services) and what it reads back.

Read serializers take rows whose attempts are already prefetched and compute each run's boundary once, from
those rows, so rendering a page costs no query per run.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from durableruns import services, timeline
from durableruns.boundary import Boundary, Zone
from durableruns.holdings import HoldState
from durableruns.models import Escalation, Intervention, RunState, RunStatus, RunStep, StepStatus
from durableruns.registry import startable_workflows

OUTCOMES = [
    (Intervention.Action.HAPPENED.value, Intervention.Action.HAPPENED.label),
    (Intervention.Action.DID_NOT_HAPPEN.value, Intervention.Action.DID_NOT_HAPPEN.label),
    (Intervention.Action.ABANDON.value, Intervention.Action.ABANDON.label),
]
ESCALATION_STATES = [("open", "not decided yet"), ("decided", "decided"), ("all", "open and decided")]


# -- shared helpers ------------------------------------------------------------------------------------------


def unstorable_text(value: Any) -> str | None:
    """Say why `value` cannot be stored in PostgreSQL's jsonb, or None if it can.

    JSON allows "\\u0000" and lone surrogates ("\\ud800"); jsonb refuses both with a DataError, which would
    surface as a 500. Walked with a stack, not recursion, so a deeply nested body cannot exhaust the stack.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            if "\x00" in item:
                return "text in JSON may not contain NUL characters (\\u0000)"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "text in JSON may not contain unpaired surrogates"
    return None


class StorableJSONField(serializers.JSONField):
    """Any JSON value the database can store (a decision's result may be any JSON)."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        problem = unstorable_text(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value


@extend_schema_field({"type": "object", "additionalProperties": True})
class JSONObjectField(StorableJSONField):
    """Storable JSON, documented as an object: the services refuse anything else with a clear message."""


class WorkflowNameField(serializers.CharField):
    """A workflow's name. Checked by the service (an unknown one is `unknown_workflow`, 400), and listed as an
    enum in the schema, read from the registry when the schema is served, so clients see what this deploy runs
    (internal workflows left out: no caller of the API may start one)."""


class WorkflowNameFieldExtension(OpenApiSerializerFieldExtension):
    target_class = WorkflowNameField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        return {"type": "string", "enum": sorted(startable_workflows())}  # internal ones are started by code only


class RunStatusField(serializers.ChoiceField):
    """A run's status: documented once, as the component RunStatusEnum."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=RunStatus.choices, **kwargs)


class StepStatusField(serializers.ChoiceField):
    """An attempt's status: documented once, as the component StepStatusEnum."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=StepStatus.choices, **kwargs)


class _NamedEnumExtension(OpenApiSerializerFieldExtension):
    """Name a choice set's component here rather than in the site's ENUM_NAME_OVERRIDES.

    Runs and attempts both have a field called `status` with different choices; left to drf-spectacular, the
    two collide and the document warns (failing `spectacular --fail-on-warn` on a site without overrides).
    """

    component_name = ""
    choices: Any = None

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema = {
            "type": "string",
            "enum": list(self.choices.values),
            "description": "\n".join(f"* `{value}` - {label}" for value, label in self.choices.choices),
        }
        component = ResolvedComponent(
            name=self.component_name, type=ResolvedComponent.SCHEMA, object=self.component_name, schema=schema
        )
        auto_schema.registry.register_on_missing(component)
        return component.ref


class RunStatusFieldExtension(_NamedEnumExtension):
    target_class = RunStatusField
    component_name = "RunStatusEnum"
    choices = RunStatus


class StepStatusFieldExtension(_NamedEnumExtension):
    target_class = StepStatusField
    component_name = "StepStatusEnum"
    choices = StepStatus


def _boundary(serializer: serializers.Field, run: RunState) -> Boundary:
    """The run's boundary from its prefetched attempts, computed once per run per response."""
    cache: dict[str, Boundary] = serializer.context.setdefault("boundaries", {})
    if run.run_id not in cache:
        cache[run.run_id] = services.boundary_of(run)
    return cache[run.run_id]


def _sentence(serializer: serializers.Field, run: RunState) -> str:
    return _boundary(serializer, run).sentence(timezone.get_current_timezone())


# -- requests ------------------------------------------------------------------------------------------------


class StartRunSerializer(serializers.Serializer):
    """POST /api/runs/: which workflow, with what input, under which run_id (generated if omitted)."""

    workflow = WorkflowNameField(max_length=200, help_text="A registered workflow's name.")
    input = JSONObjectField(help_text="The run's input: a JSON object.")
    run_id = serializers.CharField(
        max_length=200, required=False, help_text="Your id for the run (unique); generated if omitted."
    )


class DecisionRequestSerializer(serializers.Serializer):
    """POST /api/escalations/{id}/decide/: the outcome a person established, and why."""

    outcome = serializers.ChoiceField(choices=OUTCOMES)
    note = serializers.CharField(help_text="Why: what was checked, and where. Required.")
    result = StorableJSONField(
        required=False,
        allow_null=True,
        help_text="With 'happened' only: the step's result to record (any JSON).",
    )


class EventRequestSerializer(serializers.Serializer):
    """POST /api/runs/{run_id}/events/: an event for the run, as a partner's webhook relay sends it."""

    event = serializers.CharField(max_length=200, help_text="The event's name: what a wait_for of the run waits for.")
    payload = JSONObjectField(required=False, allow_null=True, help_text="A JSON object; null or absent is {}.")
    key = serializers.CharField(
        max_length=500,
        required=False,
        allow_null=True,
        help_text="Your idempotency key: an event with a key the run has seen is not recorded again (200).",
    )


class ApprovalDecisionSerializer(serializers.Serializer):
    """POST /api/runs/{run_id}/decide/: approve or reject the approval the run waits at."""

    step = serializers.CharField(max_length=200, help_text="The approval's name (its step).")
    outcome = serializers.ChoiceField(choices=[("approve", "approve"), ("reject", "reject")])
    note = serializers.CharField(help_text="Why. Required.")


class EventSerializer(serializers.Serializer):
    """An event sent to a run: kept until a wait for its name consumes it."""

    id = serializers.IntegerField()
    event = serializers.CharField()
    key = serializers.CharField(allow_null=True)
    payload = serializers.JSONField()
    sent_at = serializers.DateTimeField()
    consumed_step = serializers.CharField(allow_blank=True, help_text="The wait that consumed it ('' if none yet).")
    consumed_attempt = serializers.IntegerField(allow_null=True)
    consumed_at = serializers.DateTimeField(allow_null=True)


class EventRecordedSerializer(serializers.Serializer):
    run_id = serializers.CharField()
    event = serializers.CharField()
    recorded = serializers.BooleanField(help_text="False: the run had an event with this key already.")


class StaffNoteSerializer(serializers.Serializer):
    """POST /api/runs/{run_id}/cancel/ and /retry/: why, recorded with who and when."""

    note = serializers.CharField(help_text="Why: what was checked, and where. Required.")


class RunFilterSerializer(serializers.Serializer):
    """Query parameters of GET /api/runs/; blank ones are ignored."""

    status = RunStatusField(required=False, allow_blank=True)
    workflow = serializers.CharField(max_length=200, required=False, allow_blank=True)
    effect_key = serializers.CharField(
        max_length=500, required=False, allow_blank=True, help_text="Runs with an attempt under this effect key."
    )
    run_id = serializers.CharField(max_length=200, required=False, allow_blank=True)
    waiting_for = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        help_text="Runs waiting at this wait step (a sleep, a wait for an event, an approval).",
    )


class EscalationFilterSerializer(serializers.Serializer):
    """Query parameters of GET /api/escalations/."""

    state = serializers.ChoiceField(choices=ESCALATION_STATES, default="open", required=False)


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

    class Meta:
        model = RunState
        fields = [
            "run_id",
            "workflow",
            "status",
            "sentence",
            "cursor",
            "owner",
            "lease_expires_at",
            "wake_at",
            "reason",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_sentence(self, run: RunState) -> str:
        return _sentence(self, run)


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
