"""Traces (durableruns.tracing): a pass's span, its attempts' spans and their outcomes, the trace a run continues,
collected with the OpenTelemetry SDK's in-memory exporter (in-process) or from a worker's span file (subprocess)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from opentelemetry.util._once import Once

import durableruns
from durableruns import Workflow, services
from durableruns.models import RunState, RunStatus
from tests.conftest import ROOT, database_url
from tests.factories import complete, crash_after_intent, make_run

pytestmark = pytest.mark.django_db(transaction=True)

far_calls = Workflow("traced_far_call")


@far_calls.step(policy="re_executable")
def call_out(ctx: Any) -> dict[str, Any]:
    """Stands for a step whose HTTP client is instrumented: its span is opened while the step runs."""
    with trace.get_tracer("tests.far").start_as_current_span("POST /charges"):
        return {"ok": True}


def _reset_global_provider() -> None:
    # The API sets its global provider once per process; its own test utilities reset it this way.
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@contextmanager
def configured() -> Iterator[InMemorySpanExporter]:
    """A configured tracer provider whose finished spans the caller reads; none again afterwards."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_global_provider()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _reset_global_provider()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with configured() as exporter:
        yield exporter


@pytest.fixture(autouse=True)
def no_backoff(settings):
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return {k.removeprefix("durableruns."): v for k, v in (span.attributes or {}).items()}


def test_a_pass_continues_the_trace_of_the_request_that_started_the_run(spans):
    with trace.get_tracer("tests").start_as_current_span("POST /orders") as request:
        run_id = make_run("scripted")
    recorded = RunState.objects.get(pk=run_id).trace_context
    request_context = request.get_span_context()
    assert recorded["traceparent"].startswith(f"00-{request_context.trace_id:032x}-{request_context.span_id:016x}-")
    spans.clear()  # only the worker's spans from here

    services.resume_due()  # no span is current here: the pass's parent comes from the record alone

    (run,) = named(spans, "run ")
    assert run.name == "run scripted" and run.kind is trace.SpanKind.CONSUMER
    assert run.context.trace_id == request_context.trace_id and run.parent.span_id == request_context.span_id
    assert attrs(run) == {"run_id": run_id, "workflow": "scripted", "epoch": 1, "outcome": "completed", "steps_run": 3}
    steps = named(spans, "step ")
    assert [s.name for s in steps] == ["step first", "step second", "step third"]
    assert all(s.parent.span_id == run.context.span_id and s.context.trace_id == run.context.trace_id for s in steps)
    assert [attrs(s) for s in steps] == [
        {"run_id": run_id, "workflow": "scripted", "step": name, "attempt": 1, "policy": policy, "outcome": "completed"}
        for name, policy in (("first", "re_executable"), ("second", "resolvable"), ("third", "escalate"))
    ]


def test_a_steps_own_far_call_nests_under_its_attempt(spans):
    make_run("traced_far_call")
    services.resume_due()
    (step,) = named(spans, "step ")
    (far,) = named(spans, "POST ")
    assert far.parent.span_id == step.context.span_id


def test_a_run_started_with_no_span_current_records_no_context_and_each_pass_is_its_own_root(spans):
    run_id = make_run("scripted")
    assert RunState.objects.get(pk=run_id).trace_context is None
    services.resume_due()
    (run,) = named(spans, "run ")
    assert run.parent is None and attrs(run)["outcome"] == "completed"


def test_a_rejected_attempt_is_failed_and_the_next_attempt_completes(spans):
    run_id = make_run(input={"first": "reject_once"})
    services.resume_due()
    first = [s for s in named(spans, "step first")]
    assert [(attrs(s)["attempt"], attrs(s)["outcome"]) for s in first] == [(1, "failed"), (2, "completed")]
    failed = first[0]
    assert failed.status.status_code is StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in failed.events] == ["durableruns.errors.Rejected"]
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED


def test_a_run_that_fails_ends_its_pass_span_in_error(spans):
    make_run(input={"first": "reject"})
    services.resume_due()
    (run,) = named(spans, "run ")
    assert attrs(run)["outcome"] == "failed" and run.status.status_code is StatusCode.ERROR
    assert [attrs(s)["outcome"] for s in named(spans, "step first")] == ["failed"] * 3


def test_a_call_that_raises_without_an_answer_is_in_doubt_then_settled_by_policy(spans):
    make_run(input={"second": "boom", "lookup": None})
    services.resume_due()
    (call,) = named(spans, "step second")
    assert attrs(call)["outcome"] == "in_doubt" and call.status.status_code is StatusCode.ERROR
    (settled,) = named(spans, "settle second")
    # not found, and absence is not provable before the lag: still in doubt, the run waits
    assert (attrs(settled)["attempt"], attrs(settled)["outcome"], attrs(settled)["action"]) == (1, "in_doubt", "wait")
    assert settled.parent.span_id == named(spans, "run ")[0].context.span_id
    assert attrs(named(spans, "run ")[0])["outcome"] == "waiting"


def test_in_doubt_after_a_crash_resolved_by_lookup(spans):
    run_id = make_run(input={"lookup": {"charge": "ch_1"}})
    complete(run_id, "first", {})
    crash_after_intent(run_id, "second", cursor=1)
    services.resume_due()
    (settled,) = named(spans, "settle second")
    assert attrs(settled) == {
        "run_id": run_id,
        "workflow": "scripted",
        "step": "second",
        "attempt": 1,
        "policy": "resolvable",
        "outcome": "resolved_by_lookup",
        "action": "complete",
    }
    assert [s.name for s in named(spans, "step ")] == ["step third"]  # second was not called again


@pytest.mark.parametrize("decision", ["happened", "did_not_happen", "abandon"])
def test_in_doubt_after_a_crash_escalated_then_decided_by_staff(spans, decision):
    with trace.get_tracer("tests").start_as_current_span("POST /orders") as request:
        run_id = make_run()
    complete(run_id, "first", {})
    complete(run_id, "second", {})
    crash_after_intent(run_id, "third", cursor=2)
    services.resume_due()
    (escalated,) = named(spans, "settle third")
    assert (attrs(escalated)["attempt"], attrs(escalated)["outcome"], attrs(escalated)["action"]) == (
        1,
        "in_doubt",
        "escalate",
    )
    assert attrs(named(spans, "run ")[0])["outcome"] == "needs_decision"
    spans.clear()

    with trace.get_tracer("tests").start_as_current_span("POST /admin/decide") as admin:
        result = {"id": "m-1"} if decision == "happened" else None
        durableruns.decide(run_id, "third", decision, by="alice", note="checked the outbox", result=result)
    (decided,) = named(spans, "decide third")
    assert attrs(decided) == {
        "run_id": run_id,
        "workflow": "scripted",
        "step": "third",
        "attempt": 1,
        "policy": "escalate",
        "outcome": "decided",
        "decision": decision,
    }
    # in the run's trace, a child of the request that started it; linked to the request of the person deciding
    assert decided.parent.span_id == request.get_span_context().span_id
    assert decided.context.trace_id == request.get_span_context().trace_id
    assert [link.context.span_id for link in decided.links] == [admin.get_span_context().span_id]
    spans.clear()

    services.resume_due()
    settled = [(attrs(s)["attempt"], attrs(s)["outcome"], attrs(s)["action"]) for s in named(spans, "settle ")]
    called = [(s.name, attrs(s)["attempt"], attrs(s)["outcome"]) for s in named(spans, "step ")]
    final = RunState.objects.get(pk=run_id).status
    if decision == "did_not_happen":  # the pass acts on the decision: a new attempt
        assert settled == [(1, "decided", "run")] and called == [("step third", 2, "completed")]
    else:  # the decision itself completed the step (happened) or cancelled the run (abandon)
        assert settled == [] and called == []
    assert final == {"abandon": "cancelled"}.get(decision, "completed")


def test_without_a_configured_provider_nothing_is_recorded_and_with_one_a_pass_makes_no_more_queries(settings):
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    # An idle claim looks for stopped runs to reopen once per process, then once a minute: done here first, and
    # not due again within the test, so the two passes compared make the same statements whatever ran before.
    settings.DURABLERUNS_MISSING_STEP_RETRY_SECONDS = 3600
    services.resume_due()
    with trace.get_tracer("tests").start_as_current_span("not recorded"):
        untraced = make_run("scripted")  # the API's default span is invalid: there is no context to record
    assert RunState.objects.get(pk=untraced).trace_context is None
    with CaptureQueriesContext(connection) as without:
        services.resume_due()
    with configured() as exporter:
        with trace.get_tracer("tests").start_as_current_span("POST /orders"):
            traced = make_run("scripted")
        with CaptureQueriesContext(connection) as with_provider:
            services.resume_due()
        assert len(named(exporter, "run ")) == 1 and len(named(exporter, "step ")) == 3
    assert RunState.objects.get(pk=traced).trace_context is not None
    assert set(RunState.objects.values_list("status", flat=True)) == {RunStatus.COMPLETED}
    # the trace context rides on the claim: a traced pass reads nothing more
    assert len(with_provider.captured_queries) == len(without.captured_queries)


_WITHOUT = """
import sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

if sys.argv[1] == "blocked":  # as if the [otel] extra were not installed
    sys.meta_path.insert(0, Blocked())

import django
django.setup()
from durableruns import engine, services
with_request = services.start_run("scripted", {})
services.resume_due()
from durableruns.models import RunState
run = RunState.objects.get(pk=with_request)
print(run.status, run.trace_context, engine.tracing_in_use(),
      sorted(m for m in sys.modules if m.startswith("opentelemetry") or m == "durableruns.tracing"))
"""


@pytest.mark.parametrize("extra", ["blocked", "installed"])
def test_a_site_that_does_not_trace_imports_nothing_of_opentelemetry(extra):
    """Without the extra (its import blocked), or with it and no tracing, runs work and nothing is imported."""
    env = dict(
        os.environ,
        DATABASE_URL=database_url(),
        DURABLERUNS_WORKFLOW_MODULES="tests.workflows",
        DJANGO_SETTINGS_MODULE="project.settings",
    )
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT, extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["completed", "None", "None", "[]"]


def _read_spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.postgres
def test_worker_processes_continue_the_trace_across_a_crash(spans, workers, tmp_path):
    """A worker killed inside a step leaves the attempt in doubt; the next worker's pass settles it by lookup.
    Both workers' passes are children of the span that started the run."""
    with trace.get_tracer("tests").start_as_current_span("POST /orders") as request:
        run_id = make_run(input={"lookup": {"charge": "ch_1"}})
    started = request.get_span_context()
    out = tmp_path / "spans.jsonl"
    path = os.pathsep.join(p for p in (str(ROOT / "tests" / "otel"), os.environ.get("PYTHONPATH")) if p)
    env = {"PYTHONPATH": path, "DR_TEST_SPANS": str(out)}
    killed = workers.run("--lease", "0.5", DURABLERUNS_CRASH_AT="second@after_intent", **env)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    # the killed pass never ended its span; the first step's attempt ended before the kill
    assert [(s["name"], s["attributes"]["durableruns.outcome"]) for s in _read_spans(out)] == [
        ("step first", "completed")
    ]
    time.sleep(0.6)  # the dead worker's lease runs out
    resumed = workers.run("--lease", "0.5", **env)
    assert resumed.returncode == 0, resumed.stderr
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED

    written = _read_spans(out)
    runs = [s for s in written if s["name"] == "run scripted"]
    assert len(runs) == 1 and runs[0]["attributes"]["durableruns.outcome"] == "completed"
    (settled,) = [s for s in written if s["name"] == "settle second"]
    assert (settled["attributes"]["durableruns.attempt"], settled["attributes"]["durableruns.outcome"]) == (
        1,
        "resolved_by_lookup",
    )
    trace_id, request_id = f"0x{started.trace_id:032x}", f"0x{started.span_id:016x}"
    assert {s["context"]["trace_id"] for s in written} == {trace_id}  # both processes', one trace
    assert runs[0]["parent_id"] == request_id
    assert settled["parent_id"] == runs[0]["context"]["span_id"]
    first = [s for s in written if s["name"] == "step first"]
    assert len(first) == 1 and first[0]["parent_id"] != runs[0]["context"]["span_id"]  # the killed pass's child
