"""durableruns.held: which results wait for a later commit (pure)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured

from durableruns import conf
from durableruns.held import LIMIT, may_hold, unrecorded
from durableruns.policies import Policy
from durableruns.rates import Rate
from durableruns.steps import Step
from durableruns.waits import Kind, Wait


def step(name: str = "s", **facts: object) -> Step:
    return Step(name=name, fn=lambda ctx: None, **{"policy": Policy.RE_EXECUTABLE, "intent": False, **facts})


def holds(current: Step, following: Step | None, **given: object) -> bool:
    return may_hold(current, following, **{"fresh": True, "held": 0, "age": 0.0, "window": 0.05, **given})


def test_a_result_waits_only_between_two_steps_that_record_no_intent():
    assert holds(step(), step("t"))
    assert not holds(step(intent=True), step("t"))  # its intent was recorded: its result is due with the next
    assert not holds(step(), step("t", intent=True))  # the next one's intent commits it, before that step acts
    assert not holds(step(), None)  # the last step: its result ends the run
    assert not holds(step(), step("t", policy=Policy.RESOLVABLE, intent=True))


def test_a_step_that_waits_asks_takes_turns_or_acquires_breaks_the_chain():
    assert not unrecorded(step(wait=Wait(kind=Kind.SLEEP)))
    assert not unrecorded(step(when=lambda ctx: True))
    assert not unrecorded(step(rate=Rate(limit=1, window=timedelta(seconds=1))))
    assert not unrecorded(step(releaser=step("s:release")))
    assert unrecorded(step())


def test_the_window_the_count_and_the_next_steps_history_bound_a_chain():
    assert not holds(step(), step("t"), window=0)  # 0: every result alone
    assert not holds(step(), step("t"), age=0.05)  # the first held result was started a window ago
    assert holds(step(), step("t"), age=0.049)
    assert not holds(step(), step("t"), held=LIMIT - 1)
    assert not holds(step(), step("t"), fresh=False)  # the next step has attempts to settle first


def test_the_window_setting_has_a_default_and_refuses_a_negative(settings):
    assert conf.hold_results() == 0.05
    settings.DURABLERUNS_HOLD_RESULTS_SECONDS = 0
    assert conf.hold_results() == 0
    settings.DURABLERUNS_HOLD_RESULTS_SECONDS = -1
    with pytest.raises(ImproperlyConfigured, match="HOLD_RESULTS"):
        conf.hold_results()
