"""The API's shared fields: what requests and responses both use (storable JSON, workflow names, statuses
named in the schema), and the choices they offer."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from durableruns.models import Intervention, RunStatus, StepStatus
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


BULK_ACTIONS = ("cancel", "retry", "restart")  # durableruns.bulks.ACTIONS


class BulkActionField(serializers.ChoiceField):
    """A bulk act's action: documented once, as the component BulkActionEnum (a staff act's `action` is another)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=[(a, a) for a in BULK_ACTIONS], **kwargs)


class BulkActionFieldExtension(_NamedEnumExtension):
    target_class = BulkActionField
    component_name = "BulkActionEnum"

    class choices:  # the shape _NamedEnumExtension reads: values, and (value, label) pairs
        values = BULK_ACTIONS
        choices = [(a, a) for a in BULK_ACTIONS]
