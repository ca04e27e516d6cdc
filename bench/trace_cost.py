"""What traces cost a worker: this process's CPU time per run of `scripted` (3 steps) through resume_due, with no
tracer provider configured and with the OpenTelemetry SDK's in-memory exporter (a pass span and three attempt
spans a run), in alternating rounds. Runs are started inside a span, so each records its trace context.

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=project.settings DURABLERUNS_WORKFLOW_MODULES=tests.workflows \\
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/SCRATCH .venv/bin/python bench/trace_cost.py [RUNS] [ROUNDS]

SCRATCH is a migrated database with no runs (the script refuses another): it deletes its own runs between rounds.
CPU time, not wall time, so that other load on the machine moves the figures less.
"""

from __future__ import annotations

import statistics
import sys
import time

import django

django.setup()

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.util._once import Once  # noqa: E402

from durableruns import services  # noqa: E402
from durableruns.models import RunState, RunStep, RunStatus  # noqa: E402


def configure(provider: TracerProvider | None) -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # the API sets its provider once; its own test utilities reset it so
    trace._TRACER_PROVIDER = None
    if provider is not None:
        trace.set_tracer_provider(provider)


def clear() -> None:
    RunStep.objects.all().delete()
    RunState.objects.all().delete()


def one_round(runs: int, provider: TracerProvider | None) -> float:
    configure(provider)
    clear()
    with trace.get_tracer("bench").start_as_current_span("request"):
        for _ in range(runs):
            services.start_run("scripted", {})
    started = time.process_time()
    services.resume_due()
    spent = time.process_time() - started
    assert RunState.objects.filter(status=RunStatus.COMPLETED).count() == runs
    return spent / runs * 1000


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    if RunState.objects.exists():
        sys.exit("this database holds runs: point DATABASE_URL at a scratch database")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    figures: dict[str, list[float]] = {"no provider": [], "SDK, in-memory exporter": []}
    try:
        for _ in range(rounds):
            figures["no provider"].append(one_round(runs, None))
            figures["SDK, in-memory exporter"].append(one_round(runs, provider))
    finally:
        clear()
    for name, ms in figures.items():
        print(f"{name}: {statistics.median(ms):.2f} ms CPU per run (median of {rounds} rounds of {runs} runs)")
    print(f"spans exported: {len(exporter.get_finished_spans())}")


if __name__ == "__main__":
    main()
