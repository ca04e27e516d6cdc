"""A step with a rate limit takes its turn before an attempt acts (durableruns.rates): a kind of move the engine
makes, like a wait's, not a second driver. The engine asks here once per attempt that is about to start (a first
attempt, a retry, a re-execution after doubt; never for an attempt settled by its lookup, which starts nothing);
the turn is taken, or the run is handed back waiting for the moment its turn comes, holding nothing.
"""

from __future__ import annotations

from durableruns import store
from durableruns.models import RunStatus
from durableruns.passes import Driver, Pass, RunOutcome, Stop
from durableruns.rates import waiting_reason
from durableruns.registry import NAME_LIMIT, Step

RATE_KEY_RAISED = "its rate_key raised: "


def take_turn(driver: Driver, state: Pass, step: Step, index: int, attempt: int) -> None:
    """Take `step`'s turn for `attempt` under its rate limit, or raise Stop with the run handed back waiting.

    The key is asked of the step's rate_key once per attempt: a run that waited for its turn goes on under the
    key its turn was given for (recorded with the turn), and is not asked again."""
    rate = step.rate
    assert rate is not None
    held = store.turn_of(state.run_id, step.name)
    if held is not None:
        key = held[0]
    elif step.rate_key is None:
        key = ""
    else:
        rate_key = step.rate_key
        key = driver.asking(
            state, step, index, lambda: _key(step, rate_key(state.context(step, attempt))), raised=RATE_KEY_RAISED
        )
    until = store.take_turn(state.lease, step=step.name, key=key, rate=rate, clock=driver.clock)
    if until is not None:
        raise Stop(
            RunOutcome(
                run_id=state.run_id,
                status=RunStatus.WAITING,
                steps_run=state.steps_run,
                detail=waiting_reason(step.name, key, until),
                wake_at=until,
            )
        )


def _key(step: Step, value: object) -> str:
    """A rate key as the record keeps it: str() of what rate_key returned, at most NAME_LIMIT characters."""
    key = str(value)
    if len(key) > NAME_LIMIT:
        raise ValueError(
            f"{step.name}: its rate key is {len(key)} characters long; the record keeps at most {NAME_LIMIT}"
        )
    return key
