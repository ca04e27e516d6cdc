"""A declared step: its function, its in-doubt policy and the facts that policy needs. No database.

Workflow.step() and its siblings in durableruns.registry build these; the engine and the edges read them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from durableruns.errors import DeclarationError, Rejected
from durableruns.holdings import Acquisition
from durableruns.policies import Policy
from durableruns.rates import Rate
from durableruns.waits import Wait

if TYPE_CHECKING:
    from durableruns.context import StepContext

StepFn = Callable[["StepContext"], Any]
LookupFn = Callable[["StepContext"], "dict[str, Any] | None"]
WhenFn = Callable[["StepContext"], Any]


@dataclass(frozen=True, kw_only=True)
class Step:
    """A declared step: its function, its in-doubt policy and the facts that policy needs."""

    name: str
    fn: StepFn
    policy: Policy
    lookup: LookupFn | None = None
    lookup_lag: timedelta = timedelta(0)
    timeout: timedelta | None = None
    max_attempts: int = 3
    fails_on: tuple[type[BaseException], ...] = ()
    intent: bool = True
    # An acquisition (a hold in another system) declares how to give it back: its release, as a step of its own.
    releaser: Step | None = None
    hold_expires_after: timedelta | None = None
    released_by: str = ""
    # Its intent commit waits for a synchronous standby (DURABLERUNS_STANDBY_INTENTS), as an escalate step's does.
    wait_for_standby: bool = False
    # At most rate.limit attempts per key start in any window of rate.window (durableruns.rates); the key is
    # asked of `rate_key` once per attempt (None: one bucket for the step).
    rate: Rate | None = None
    rate_key: Callable[[StepContext], Any] | None = None

    @property
    def waits_for_standby(self) -> bool:
        """Whether a lost intent would let this step run again unasked: it has no lookup to settle it and is not
        re_executable (policy escalate), or it says so (wait_for_standby=True). DURABLERUNS_STANDBY_INTENTS makes
        such intent commits wait for a standby, so a failover cannot lose them."""
        return self.wait_for_standby or self.policy is Policy.ESCALATE

    # Asked once when the run reaches the step: False records it skipped (durableruns.waits).
    when: WhenFn | None = None
    # A step that waits (a sleep, a wait for an event, an approval, a join) instead of acting; a sleep's time is
    # asked of `sleep_for` (a timedelta or a function of ctx returning one) or `sleep_until` (a function returning
    # a time).
    wait: Wait | None = None
    sleep_for: timedelta | Callable[[StepContext], timedelta] | None = None
    sleep_until: Callable[[StepContext], Any] | None = None
    # An approval, or an escalation of this step, as work for people (durableruns.inbox): the group it is
    # assigned to (a name, or a function of ctx asked once as it opens), due that long after it opens (the
    # database's clock), moved to `escalate_to` once overdue by as much again.
    assign_to: str | Callable[[StepContext], Any] | None = None
    due: timedelta | None = None
    escalate_to: str = ""

    @property
    def kind(self) -> str:
        """What the plan records for the step: its policy, or for a wait step its kind."""
        return self.wait.kind.value if self.wait is not None else self.policy.value

    @property
    def is_acquisition(self) -> bool:
        """Whether the step acquires something a run that ends unfinished must give back."""
        return self.releaser is not None

    def acquisition(self) -> Acquisition:
        """The step as the pure holdings rules take it (only for an acquisition: a step with a releaser)."""
        if self.releaser is None:
            raise DeclarationError(f"{self.name} is not an acquisition: it declares no release=")
        return Acquisition(
            step=self.name,
            release_step=self.releaser.name,
            hold_expires_after=self.hold_expires_after,
            released_by=self.released_by,
            has_lookup=self.lookup is not None,
        )

    @property
    def doc(self) -> str:
        """The step's docstring: for steps that escalate, how a person checks the far system by hand."""
        return (self.fn.__doc__ or "").strip()

    def is_rejection(self, exc: BaseException) -> bool:
        """Tell an observed rejection (failed) from anything else (in doubt unless re-executable)."""
        return isinstance(exc, (Rejected, *self.fails_on))
