"""The API's requests: what a client sends, parsed here and checked by the services."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from durableruns.api.fields import (
    ESCALATION_STATES,
    OUTCOMES,
    BulkActionField,
    JSONObjectField,
    RunStatusField,
    StorableJSONField,
    WorkflowNameField,
)
from durableruns.attributes import parse_filter
from durableruns.errors import InvalidInput


class StartRunSerializer(serializers.Serializer):
    """POST /api/runs/: which workflow, with what input, under which run_id (generated if omitted)."""

    workflow = WorkflowNameField(max_length=200, help_text="A registered workflow's name.")
    input = JSONObjectField(help_text="The run's input: a JSON object.")
    run_id = serializers.CharField(
        max_length=200, required=False, help_text="Your id for the run (unique); generated if omitted."
    )
    deadline_seconds = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=100 * 366 * 86400,
        help_text="The run must have ended this many seconds after its start (the database's clock), or it ends as "
        "its workflow's on_deadline says; default: the workflow's own deadline, if it declares one.",
    )
    debounce_seconds = serializers.FloatField(
        required=False,
        min_value=0.001,
        max_value=366 * 86400,
        help_text="With key: a debounced start. While the run started with this key has not begun, this start "
        "replaces its input and moves its start to now + debounce_seconds (the same run_id is answered); once it "
        "has begun, a new run is started.",
    )
    key = serializers.CharField(
        max_length=200, required=False, help_text="The debounce key (with debounce_seconds), e.g. 'order-17'."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("debounce_seconds" in attrs) != ("key" in attrs):
            raise serializers.ValidationError("debounce_seconds and key go together: give both or neither")
        return attrs


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


class RestartRequestSerializer(serializers.Serializer):
    """POST /api/runs/{run_id}/restart/: the step to restart from, and why."""

    from_step = serializers.CharField(max_length=200, help_text="A step of the plan: the steps before it are copied.")
    note = serializers.CharField(help_text="Why: what was fixed or checked. Required.")


class RestartedSerializer(serializers.Serializer):
    run_id = serializers.CharField(help_text="The new run's id.")


# A run's attributes in the schema: name -> a string or an integer (durableruns.attributes).
ATTRIBUTES_SCHEMA = {"type": "object", "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}


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
    attr = serializers.ListField(
        child=serializers.CharField(max_length=300, trim_whitespace=False),
        required=False,
        help_text="name:value, repeatable: runs with every one of these attributes, exact values (an integer "
        "attribute matches its decimal text), e.g. attr=po:PO-2026-0041.",
    )

    def validate_attr(self, value: list[str]) -> list[tuple[str, str]]:
        try:
            return [parse_filter(text) for text in value]
        except InvalidInput as exc:
            raise serializers.ValidationError(str(exc)) from None


class EscalationFilterSerializer(serializers.Serializer):
    """Query parameters of GET /api/escalations/."""

    state = serializers.ChoiceField(choices=ESCALATION_STATES, default="open", required=False)


class BulkRequestSerializer(serializers.Serializer):
    """POST /api/runs/bulk/: one act for every run a filter of GET /api/runs/ matches, and why."""

    action = BulkActionField(help_text="The act: each needs the single act's permission.")
    filter = JSONObjectField(
        help_text="The query parameters of GET /api/runs/ as an object (status, workflow, run_id, effect_key, "
        "waiting_for, attr: a list of name:value, or one); at least one, none unknown. The runs it matches now "
        "(in your scope) are the bulk's, each checked again when acted on."
    )
    note = serializers.CharField(help_text="Why: recorded on each run's staff act. Required.")
    from_step = serializers.CharField(
        max_length=200, required=False, help_text="With restart (required there): the step to restart each run from."
    )

    def validate_filter(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise serializers.ValidationError("the filter must be an object of GET /api/runs/'s query parameters")
        known = RunFilterSerializer().fields
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise serializers.ValidationError(
                f"unknown filter {', '.join(map(repr, unknown))}: GET /api/runs/ takes {', '.join(known)}"
            )
        data = dict(value)
        if isinstance(data.get("attr"), str):
            data["attr"] = [data["attr"]]
        parsed = RunFilterSerializer(data=data)
        if not parsed.is_valid():
            raise serializers.ValidationError(parsed.errors)
        filters = {name: given for name, given in parsed.validated_data.items() if given}
        if not filters:
            raise serializers.ValidationError("give at least one filter: a bulk act on every run is never implied")
        return filters

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["action"] == "restart" and not attrs.get("from_step"):
            raise serializers.ValidationError({"from_step": "a restart needs from_step: the step to restart from"})
        if attrs["action"] != "restart" and "from_step" in attrs:
            raise serializers.ValidationError({"from_step": f"from_step goes only with restart, not {attrs['action']}"})
        return attrs


class BulkStartedSerializer(serializers.Serializer):
    bulk_id = serializers.CharField(help_text="GET /api/runs/bulk/{bulk_id}/ says how far it is.")
    total = serializers.IntegerField(help_text="How many runs matched, frozen now.")


class BulkFailedSerializer(serializers.Serializer):
    run_id = serializers.CharField()
    reason = serializers.CharField(help_text="Why it was skipped: it no longer fitted the filter or the act.")


class BulkProgressSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=[("running", "running"), ("finished", "finished")])
    total = serializers.IntegerField()
    done = serializers.IntegerField(help_text="Runs taken so far: acted on, or skipped (listed in failed).")
    failed = BulkFailedSerializer(many=True)
