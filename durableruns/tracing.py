"""OpenTelemetry spans for the passes over runs and the attempts of their steps.

Imported only once the process uses OpenTelemetry (durableruns.engine.tracing_in_use): a site without the [otel]
extra, or with it and no tracing, imports nothing of it. Nothing is recorded until a tracer provider is configured.

A run continues the trace of the code that started it. `start()` records the trace context current then, as the
site's propagators write it (W3C traceparent and tracestate by default), in run_state.trace_context; each pass's
span is a child of it, on whichever host and however much later the pass runs, so one trace shows the request and
every pass of the run it started. Within a pass:

    run <workflow>        one pass over one run (kind CONSUMER); outcome: the run's status after the pass
      step <step>         one attempt's call, current while the step runs (its far calls' spans nest under it);
                          outcome: completed, failed or in_doubt
      settle <step>       a pass settling an attempt it found in doubt, by the step's policy (a lookup's far call
                          nests under it); outcome: in_doubt, resolved_by_lookup or decided
    decide <step>         staff deciding an escalated attempt (outcome decided; decision happened, did_not_happen
                          or abandon), in the run's trace, linked to the span current then (the admin's request)

An attempt in doubt after a crash has no span of its own ending: its process died with it. The next pass's
`settle` span is where it shows, with the attempt's number.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from durableruns.errors import FencedOut
from durableruns.policies import Action, Next, Policy
from durableruns.version import __version__

if TYPE_CHECKING:
    from durableruns.passes import RunOutcome
    from durableruns.store import Claimed

# Attribute names, in durableruns' own namespace.
RUN_ID = "durableruns.run_id"
WORKFLOW = "durableruns.workflow"
STEP = "durableruns.step"
ATTEMPT = "durableruns.attempt"
POLICY = "durableruns.policy"
OUTCOME = "durableruns.outcome"
ACTION = "durableruns.action"  # a settlement's verdict: run, complete, wait, escalate, hold, cancel, fail, stop
EPOCH = "durableruns.epoch"
STEPS_RUN = "durableruns.steps_run"
DECISION = "durableruns.decision"  # staff's: happened, did_not_happen or abandon

T = TypeVar("T")

# An attempt's outcomes.
COMPLETED = "completed"
FAILED = "failed"
IN_DOUBT = "in_doubt"
RESOLVED_BY_LOOKUP = "resolved_by_lookup"
DECIDED = "decided"
FENCED_OUT = "fenced_out"


_kept: tuple[trace.TracerProvider, trace.Tracer] | None = None


def _tracer() -> trace.Tracer:
    """durableruns' tracer from the provider configured now (a site may set it after durableruns is imported)."""
    global _kept
    provider = trace.get_tracer_provider()
    kept = _kept
    if kept is None or kept[0] is not provider:
        kept = _kept = (provider, provider.get_tracer("durableruns", __version__))
    return kept[1]


def enabled() -> bool:
    """Whether a tracer provider is configured (the API's own default, a proxy or a no-op, records nothing)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def current_context() -> dict[str, str] | None:
    """The trace context current now, as the site's propagators write it, for the run to continue; None without a
    valid span (then the run's passes start traces of their own)."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


def run_pass(claimed: Claimed, work: Callable[[Claimed], RunOutcome]) -> RunOutcome:
    """Work one claimed run (`work`) inside the pass's span, a child of the trace the run was started in."""
    if not enabled():
        return work(claimed)
    lease = claimed.lease
    parent = _run_context(claimed.trace_context)  # read with the claim: no query of its own
    attributes: dict[str, str | int] = {RUN_ID: lease.run_id, WORKFLOW: claimed.workflow, EPOCH: lease.epoch}
    with _tracer().start_as_current_span(
        f"run {claimed.workflow}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    ) as span:
        outcome = work(claimed)
        span.set_attribute(OUTCOME, outcome.status)
        span.set_attribute(STEPS_RUN, outcome.steps_run)
        if outcome.status == "failed":
            span.set_status(Status(StatusCode.ERROR, outcome.detail))
        return outcome


def _run_context(recorded: Any) -> Context | None:
    """The context a run's span is a child of: the one recorded when it started; with none, whatever is current
    (in a worker, nothing: the span is a root)."""
    return propagate.extract(recorded) if isinstance(recorded, dict) and recorded else None


def decide(
    *, run_id: str, workflow: str, step: str, attempt: int, trace_context: Any, decision: str, record: Callable[[], T]
) -> T:
    """Record staff's decision on an escalated attempt (`record`) inside a span of the run's trace, linked to the
    span current now (the request of the person deciding), if any."""
    if not enabled():
        return record()
    current = trace.get_current_span().get_span_context()
    links = [trace.Link(current)] if trace_context and current.is_valid else None
    attributes = {**_attributes(run_id, workflow, step, attempt, Policy.ESCALATE), OUTCOME: DECIDED, DECISION: decision}
    with _tracer().start_as_current_span(
        f"decide {step}", context=_run_context(trace_context), links=links, attributes=attributes
    ):
        return record()


def _attributes(run_id: str, workflow: str, step: str, attempt: int, policy: Policy) -> dict[str, Any]:
    return {RUN_ID: run_id, WORKFLOW: workflow, STEP: step, ATTEMPT: attempt, POLICY: policy.value}


@contextmanager
def call(
    *, run_id: str, workflow: str, step: str, attempt: int, policy: Policy, fails: Callable[[Exception], bool]
) -> Iterator[None]:
    """The span of one attempt's call, current while the step runs. `fails(exc)` says whether the engine records
    what the step raised as a failure (else the attempt stays in doubt)."""
    if not enabled():
        yield
        return
    with _tracer().start_as_current_span(
        f"step {step}", attributes=_attributes(run_id, workflow, step, attempt, policy)
    ) as span:
        try:
            yield
        except FencedOut:
            span.set_attribute(OUTCOME, FENCED_OUT)
            raise  # the span records the exception and its error status on the way out
        except Exception as exc:
            span.set_attribute(OUTCOME, FAILED if fails(exc) else IN_DOUBT)
            raise
        span.set_attribute(OUTCOME, COMPLETED)


def settle(*, run_id: str, workflow: str, step: str, attempt: int, policy: Policy, decide: Callable[[], Next]) -> Next:
    """Settle an in-doubt attempt (`decide` asks the lookup or reads staff's decision) inside its span."""
    if not enabled():
        return decide()
    with _tracer().start_as_current_span(
        f"settle {step}", attributes=_attributes(run_id, workflow, step, attempt, policy)
    ) as span:
        verdict = decide()
        span.set_attribute(ACTION, verdict.action.value)
        span.set_attribute(OUTCOME, settled_as(policy, verdict))
        return verdict


def settled_as(policy: Policy, verdict: Next) -> str:
    """The outcome of settling an in-doubt attempt: decided by staff, resolved by its lookup, or still in doubt
    (re-executed as such, waiting out a lookup's lag, escalated, or stopped for its crash budget)."""
    if policy is Policy.ESCALATE and verdict.action in (Action.COMPLETE, Action.RUN, Action.CANCEL):
        return DECIDED  # only a staff decision turns an escalated step into one of these
    if policy is Policy.RESOLVABLE and verdict.action in (Action.COMPLETE, Action.RUN):
        return RESOLVED_BY_LOOKUP  # found by its key, or absent past the lag
    return IN_DOUBT
