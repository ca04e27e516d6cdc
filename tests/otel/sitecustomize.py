"""Loaded as `sitecustomize` only by the worker processes tests/integration/test_tracing.py starts: a tracer provider
whose spans are written, one JSON object a line, to the file DR_TEST_SPANS names, as each span ends (a SIGKILL
later loses none of those already ended)."""

from __future__ import annotations

import json
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

_path = os.environ.get("DR_TEST_SPANS")
if _path:
    _out = open(_path, "a", buffering=1)  # line-buffered, open for the life of the process
    _provider = TracerProvider()
    _provider.add_span_processor(
        SimpleSpanProcessor(
            ConsoleSpanExporter(out=_out, formatter=lambda span: json.dumps(json.loads(span.to_json())) + "\n")
        )
    )
    trace.set_tracer_provider(_provider)
