"""Declaring workflows: the fixed interface, its errors, and the plan fingerprint."""

from __future__ import annotations

from datetime import timedelta

import pytest

from durableruns import Rejected, Workflow
from durableruns.errors import DeclarationError, UnknownWorkflow
from durableruns.policies import Policy
from durableruns.registry import get_workflow


def test_steps_run_in_declaration_order_and_are_named_by_function():
    wf = Workflow("unit_order")

    @wf.step(policy="re_executable")
    def parse_request(ctx): ...

    @wf.step(policy="resolvable", lookup=lambda ctx: None, lookup_lag=timedelta(seconds=60),
             timeout=timedelta(seconds=30), max_attempts=5, fails_on=ValueError)
    def charge(ctx): ...

    assert wf.plan == ("parse_request", "charge")
    assert get_workflow("unit_order") is wf
    step = wf["charge"]
    assert step.policy is Policy.RESOLVABLE and step.max_attempts == 5
    assert step.is_rejection(ValueError()) and step.is_rejection(Rejected()) and not step.is_rejection(OSError())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": "sometimes"}, "policy must be one of"),
        ({"policy": "resolvable"}, "needs lookup"),
        ({"policy": "escalate", "intent": False}, "only a re_executable step"),
        ({"policy": "re_executable", "max_attempts": 0}, "at least 1"),
    ],
)
def test_bad_declarations_are_refused_at_import(kwargs, message):
    wf = Workflow("unit_bad")
    with pytest.raises(DeclarationError, match=message):
        wf.step(**kwargs)


def test_policy_is_required():
    wf = Workflow("unit_required")
    with pytest.raises(TypeError):
        wf.step()  # type: ignore[call-arg]


def test_a_step_name_is_declared_once():
    wf = Workflow("unit_twice")

    @wf.step(policy="re_executable")
    def a(ctx): ...

    with pytest.raises(DeclarationError, match="declared twice"):
        wf.step(policy="re_executable")(a)


def test_fingerprint_changes_with_order_and_policy_only():
    def build(name, policies):
        wf = Workflow(name)
        for step, policy in policies:
            fn = lambda ctx: None  # noqa: E731
            fn.__name__ = step
            wf.step(policy=policy, lookup=(lambda ctx: None) if policy == "resolvable" else None)(fn)
        return wf.fingerprint

    base = build("fp1", [("a", "re_executable"), ("b", "escalate")])
    assert build("fp2", [("a", "re_executable"), ("b", "escalate")]) == base
    assert build("fp3", [("b", "escalate"), ("a", "re_executable")]) != base
    assert build("fp4", [("a", "re_executable"), ("b", "resolvable")]) != base
    assert build("fp5", [("a", "re_executable")]) != base


def test_unknown_workflow_names_the_known_ones():
    with pytest.raises(UnknownWorkflow, match="no workflow named 'nope'"):
        get_workflow("nope")


def test_first_steps_names_each_workflow_whose_first_step_records_an_intent():
    from durableruns.registry import first_steps

    records = Workflow("unit_first_records")
    quiet = Workflow("unit_first_quiet")

    @records.step(policy="escalate")
    def call(ctx): ...

    assert ("unit_first_records", records.fingerprint, "call") in first_steps()

    @records.step(policy="re_executable")
    def after(ctx): ...

    # A new step changes the fingerprint, and what the claim is told changes with it.
    assert ("unit_first_records", records.fingerprint, "call") in first_steps()

    @quiet.step(policy="re_executable", intent=False)
    def pure(ctx): ...

    assert not any(name == "unit_first_quiet" for name, _, _ in first_steps())
