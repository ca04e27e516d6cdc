"""The back office's forms: a required note, a staff decision with its optional JSON result, an approval.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.forms.fields import InvalidJSONInput

from durableruns.policies import Outcome

# -- forms -------------------------------------------------------------------------------------------------


class NoteForm(forms.Form):
    """The why of a staff action, recorded with the user's name and the time."""

    note = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 70}),
        help_text="Why: recorded with your name and the time, and shown on the run page.",
    )


# Deeper than this, a decision's result is refused by the form: later steps read results a few levels deep, and
# the admin must still render what was recorded (Python's JSON parser and indenting encoder recurse per level).
MAX_RESULT_DEPTH = 64


def nesting_depth(value: Any) -> int:
    """How many arrays and objects deep `value` nests (a scalar is 0), counted without recursion."""
    deepest, pending = 0, [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            pending.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend((v, depth + 1) for v in item)
        else:
            continue
        deepest = max(deepest, depth + 1)
    return deepest


class OptionalJSONField(forms.JSONField):
    """A JSON textarea that starts empty, not with the text 'null', and refuses JSON nested too deep to record.

    Django's JSONField catches only JSONDecodeError: text nested a few thousand levels makes json.loads raise
    RecursionError, a 500. Here it is a form error, and the box keeps what was typed.
    """

    default_error_messages = {
        "too_deep": f"The result is nested more than {MAX_RESULT_DEPTH} levels deep: nothing was recorded.",
    }

    def to_python(self, value: Any) -> Any:
        try:
            converted = super().to_python(value)
        except RecursionError:
            raise forms.ValidationError(self.error_messages["too_deep"], code="too_deep") from None
        if nesting_depth(converted) > MAX_RESULT_DEPTH:
            raise forms.ValidationError(self.error_messages["too_deep"], code="too_deep")
        return converted

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            bound = super().bound_data(data, initial)
        except RecursionError:
            return InvalidJSONInput(data)
        if isinstance(data, str) and nesting_depth(bound) > MAX_RESULT_DEPTH:
            return InvalidJSONInput(data)  # shown again as typed, not re-encoded
        return bound

    def prepare_value(self, value: Any) -> Any:
        return "" if value is None else super().prepare_value(value)


DECISION_LABELS = {
    Outcome.HAPPENED: "It happened",
    Outcome.DID_NOT_HAPPEN: "It did not happen — run it again",
    Outcome.ABANDON: "Abandon the run",
}


class DecisionForm(forms.Form):
    """One of three decisions (the button pressed), a required note, and for 'it happened' an optional result."""

    outcome = forms.ChoiceField(choices=[(o.value, label) for o, label in DECISION_LABELS.items()],
                                label="decision")
    note = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 70}),
        help_text="What you checked and what you found: recorded with your name and the time.",
    )
    result = OptionalJSONField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 70, "placeholder": '{"message_id": "msg_123"}'}),
        help_text="Only with “it happened”, optional: the step's result as JSON, as later steps would read it.",
        error_messages={"invalid": "The result is not valid JSON: nothing was recorded."},
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("outcome") not in (None, Outcome.HAPPENED) and data.get("result") is not None:
            self.add_error("result", "A result goes only with “it happened”.")
        return data




class ApprovalForm(forms.Form):
    """Approve or reject one approval (the button pressed); a rejection needs its note, an approval may say why."""

    run_id = forms.CharField(widget=forms.HiddenInput)
    step = forms.CharField(widget=forms.HiddenInput)
    outcome = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    note = forms.CharField(widget=forms.Textarea(attrs={"rows": 2, "cols": 50}), required=False,
                           help_text="Why: recorded with your name and the time (required to reject).")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("outcome") == "reject" and not str(data.get("note") or "").strip():
            raise forms.ValidationError("a rejection needs a note saying why")
        return data
