"""Prometheus metrics: gauges read from the record for the site's view, and a worker's own counters for
`resume_runs --metrics-port`.

prometheus_client is an optional extra (`pip install durableruns[metrics]`); nothing here imports it before a
metric is asked for, so a site without it still starts, and the view answers 501 saying what to install.

The record's metrics come from five queries, each reading the live work or a few counted rows, never the history
(bench/volume.py: flat from 10,000 to 1,000,000 runs kept). Runs by workflow and status (`durableruns_runs`, a
gauge: rows present now) are one statement, so one snapshot: the unfinished runs (pending, running, waiting,
needs_decision) counted exactly through run_state_unfinished_plan_idx, which holds them alone (they are few: a
site's live work grows with its rate, not its age), and the finished runs read from run_count, which triggers on
run_state keep in the commit that finishes, reopens or deletes a run (migration run_count; models.RunCount), so
the engine, staff acts and prune are all counted with no code of theirs. The same rows give
`durableruns_runs_finished_total`, a counter of runs entering each finished status that a prune never lowers
(what a graph of throughput or failure rate wants: `rate()` of it). On SQLite (one host, small) the gauge counts
run_state itself and the triggers keep the counter only. Then attempts in doubt (the pending, waiting,
lease-expired and stopped runs through their partial indexes, then their started attempts by primary key), open
escalations (their queue), and runs stopped for staff with no escalation (through run_state_stopped_idx),
counted by why they stopped. They are read at each scrape of the view, never by workers, so N workers add no
load on the record. Each worker serves only its own counters (runs it handled by outcome, steps it ran, attempts
it recorded failed, attempts it found in doubt, runs whose pass raised, passes and their duration, and its
claims' latency): a worker knows those for free.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.models import BigIntegerField, Count, Min, Sum, Value
from django.http import HttpRequest, HttpResponse

from durableruns.clock import Clock
from durableruns.distribution import is_distributed
from durableruns.models import Escalation, RunCount, RunState, RunStatus, RunStep, StepStatus
from durableruns.ops.health import stop_kind

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# A started attempt is in doubt when nobody holds its run under a live lease: the run is pending, waiting,
# stopped for staff, or running under an expired lease (its worker is gone). A finished run's leftovers are
# history, not doubt.


def _seconds(now: datetime, then: datetime | None) -> float:
    return max((now - then).total_seconds(), 0.0) if then is not None else 0.0


def record_families(clock: Clock | None = None) -> list[Any]:
    """The record's gauges as prometheus_client metric families, ages by the database's clock."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    now = (clock or Clock()).now()
    runs = GaugeMetricFamily(
        "durableruns_runs", "Runs in the record, by workflow and status.", labels=["workflow", "status"]
    )
    finished = CounterMetricFamily(
        "durableruns_runs_finished",
        "Times runs entered a finished status (completed, failed, cancelled), by workflow and status, counted in "
        "the commit that finished them since the run_count migration (which counted the runs then kept). A prune "
        "does not lower it; a failed run retried and completed counts once in each.",
        labels=["workflow", "status"],
    )
    present, entered = runs_by_status()
    for (workflow, status), count in sorted(present.items()):
        runs.add_metric([workflow, status], count)
    for (workflow, status), count in sorted(entered.items()):
        finished.add_metric([workflow, status], count)

    doubt = GaugeMetricFamily(
        "durableruns_steps_in_doubt",
        "Attempts in doubt (started, no result, no live worker holding the run), by workflow.",
        labels=["workflow"],
    )
    doubt_age = GaugeMetricFamily(
        "durableruns_step_in_doubt_oldest_seconds",
        "Age of the oldest attempt in doubt, by workflow.",
        labels=["workflow"],
    )
    for workflow, count, oldest in in_doubt_by_workflow(now):
        doubt.add_metric([workflow], count)
        doubt_age.add_metric([workflow], _seconds(now, oldest))

    escalations = GaugeMetricFamily(
        "durableruns_escalations_open", "Escalations waiting for a decision, by workflow.", labels=["workflow"]
    )
    escalation_age = GaugeMetricFamily(
        "durableruns_escalation_oldest_open_seconds",
        "How long the oldest open escalation has waited, by workflow.",
        labels=["workflow"],
    )
    for workflow, count, oldest in (
        Escalation.objects.filter(decision__isnull=True)
        .order_by()
        .values_list("run__workflow")
        .annotate(n=Count("pk"), oldest=Min("opened_at"))
        .values_list("run__workflow", "n", "oldest")
    ):
        escalations.add_metric([workflow], count)
        escalation_age.add_metric([workflow], _seconds(now, oldest))
    stopped = GaugeMetricFamily(
        "durableruns_runs_stopped",
        "Runs stopped for staff with no escalation open, by workflow and why (crash_budget, lookup_budget, "
        "lacking_steps, data_refused, other).",
        labels=["workflow", "reason"],
    )
    stopped_age = GaugeMetricFamily(
        "durableruns_run_stopped_oldest_seconds",
        "How long the oldest run stopped for staff with no escalation has stood stopped, by workflow.",
        labels=["workflow"],
    )
    counts, oldest_of = stopped_by_workflow()
    for (workflow, kind), count in sorted(counts.items()):
        stopped.add_metric([workflow, kind], count)
    for workflow, oldest in sorted(oldest_of.items()):
        stopped_age.add_metric([workflow], _seconds(now, oldest))
    return [runs, finished, doubt, doubt_age, escalations, escalation_age, stopped, stopped_age]


FINISHED_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


def runs_by_status() -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
    """Runs present by (workflow, status), exact, and times runs entered each finished status: one statement,
    so one snapshot (a run finishing meanwhile is counted once, in the status either side of its commit).

    On PostgreSQL the unfinished runs are counted through run_state_unfinished_plan_idx and the finished ones
    read from run_count, whose triggers keep them in the commit of each change: a few rows, whatever the
    history kept. Elsewhere (SQLite) run_state is counted whole and run_count gives the counter only. On a record
    distributed by Citus (durableruns.distribution) run_count's triggers are gone: run_state is counted whole, on
    every node in parallel, and the counter of finishes is the finished runs present (a prune lowers it)."""
    alias = RunState.objects.db
    if is_distributed(alias):
        counted = {
            (w, s): int(n)
            for w, s, n in RunState.objects.order_by()
            .values("workflow", "status")
            .annotate(n=Count("pk"))
            .values_list("workflow", "status", "n")
        }
        return counted, {key: n for key, n in counted.items() if key[1] in FINISHED_STATUSES}
    counted_present = connections[alias].vendor == "postgresql"
    kept = RunState.objects.order_by()
    if counted_present:
        kept = kept.unfinished()
    rows = (
        kept.values("workflow", "status")
        .annotate(present=Count("pk"), finished=Value(None, output_field=BigIntegerField()))
        .values_list("workflow", "status", "present", "finished")
        .union(
            RunCount.objects.order_by()
            .values("workflow", "status")
            .annotate(present=Sum("present"), finished=Sum("finished"))
            .values_list("workflow", "status", "present", "finished"),
            all=True,
        )
    )
    present: dict[tuple[str, str], int] = {}
    entered: dict[tuple[str, str], int] = {}
    for workflow, status, n, times in rows:
        key = (workflow, status)
        present[key] = present.get(key, 0) + int(n)
        if times is not None:  # a row of run_count
            entered[key] = entered.get(key, 0) + int(times)
    return {key: n for key, n in present.items() if n}, entered


def stopped_by_workflow() -> tuple[dict[tuple[str, str], int], dict[str, datetime]]:
    """Runs stopped for staff with no escalation: how many per (workflow, why) and when each workflow's oldest
    stopped. Read through run_state_stopped_idx; they are few (each waits on a person)."""
    counts: dict[tuple[str, str], int] = {}
    oldest: dict[str, datetime] = {}
    for workflow, reason, since in RunState.objects.stopped_unasked().values_list("workflow", "reason", "updated_at"):
        key = (workflow, stop_kind(reason))
        counts[key] = counts.get(key, 0) + 1
        oldest[workflow] = min(since, oldest.get(workflow, since))
    return counts, oldest


def in_doubt_by_workflow(now: datetime) -> list[tuple[str, int, datetime]]:
    """(workflow, attempts in doubt, the oldest's start) for each workflow with any: started attempts of runs no
    live worker holds.

    Two reads, each through a partial index of the few runs it may concern (run_state_active_idx for pending,
    waiting and lease-expired runs, run_state_stopped_idx for runs stopped for staff), then their attempts by
    primary key: one OR across both would read every run."""
    found: dict[str, tuple[int, datetime]] = {}
    for unheld in (RunState.objects.takeable(now), RunState.objects.filter(status=RunStatus.NEEDS_DECISION)):
        held = unheld.order_by().values_list("pk", flat=True)
        for workflow, count, oldest in (
            RunStep.objects.filter(status=StepStatus.STARTED, run_id__in=held)
            .order_by()
            .values_list("run__workflow")
            .annotate(n=Count("pk"), oldest=Min("started_at"))
            .values_list("run__workflow", "n", "oldest")
        ):
            before = found.get(workflow)
            found[workflow] = (count + before[0], min(oldest, before[1])) if before else (count, oldest)
    return [(workflow, count, oldest) for workflow, (count, oldest) in sorted(found.items())]


class _Collector:
    def __init__(self, families: Callable[[], list[Any]]) -> None:
        self._families = families

    def collect(self) -> Iterator[Any]:
        yield from self._families()


def render_record(clock: Clock | None = None) -> bytes:
    """The record's gauges in Prometheus' text format."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(lambda: record_families(clock)))  # type: ignore[arg-type]
    return bytes(generate_latest(registry))


def _authorized(request: HttpRequest) -> bool:
    """Staff allowed to view runs, or a scraper presenting DURABLERUNS_METRICS_TOKEN as a bearer token."""
    token = str(getattr(settings, "DURABLERUNS_METRICS_TOKEN", "") or "")
    header = request.headers.get("Authorization", "")
    if (
        token
        and header.startswith("Bearer ")
        and hmac.compare_digest(header[len("Bearer ") :].encode(), token.encode())
    ):
        return True
    user = request.user
    return bool(user.is_authenticated and user.is_staff and user.has_perm("durableruns.view_runstate"))


def metrics_view(request: HttpRequest) -> HttpResponse:
    """GET: the record's gauges for Prometheus. Include it in the site's URLs (see durableruns.ops.urls)."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD"})
    if not _authorized(request):
        return HttpResponse(
            "staff with the view permission on runs, or the metrics bearer token, only\n",
            status=401 if request.headers.get("Authorization") else 403,
            content_type="text/plain; charset=utf-8",
            headers={"WWW-Authenticate": "Bearer"},
        )
    try:
        body = render_record()
    except ImportError:
        return HttpResponse(
            "prometheus_client is not installed: pip install durableruns[metrics]\n",
            status=501,
            content_type="text/plain; charset=utf-8",
        )
    return HttpResponse(body, content_type=CONTENT_TYPE)


# -- a worker's own counters ------------------------------------------------------------------------------


class WorkerMetrics:
    """Counters of one worker process, updated as its passes go and served on their own port."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram, Summary

        self.registry = CollectorRegistry(auto_describe=True)
        self.runs = Counter(
            "durableruns_worker_runs",
            "Runs this worker handled, by the status it left them in.",
            ["status"],
            registry=self.registry,
        )
        self.steps = Counter(
            "durableruns_worker_steps", "Steps whose code this worker ran (returned or raised).", registry=self.registry
        )
        self.raised = Counter(
            "durableruns_worker_runs_raised",
            "Runs whose pass raised inside durableruns (set aside for a backoff).",
            registry=self.registry,
        )
        self.passes = Summary(
            "durableruns_worker_pass_seconds", "Duration of this worker's resume passes.", registry=self.registry
        )
        self.failed = Counter(
            "durableruns_worker_attempts_failed",
            "Attempts this worker recorded failed (the far system refused the call).",
            registry=self.registry,
        )
        self.in_doubt = Counter(
            "durableruns_worker_steps_in_doubt",
            "Times this worker found an attempt in doubt and settled it by its policy.",
            registry=self.registry,
        )
        self.claims = Histogram(
            "durableruns_worker_claim_seconds",
            "How long this worker's claims took (one statement on PostgreSQL), found or not.",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=self.registry,
        )
        self._lock = threading.Lock()

    def claimed(self, seconds: float) -> None:
        """Record one claim's duration (services.resume_due's on_claim)."""
        self.claims.observe(seconds)

    def listen(self) -> None:
        """Count this process's failed and in-doubt attempts from durableruns' signals (sent in this process)."""
        from durableruns import signals

        signals.attempt_failed.connect(self._failed, weak=False, dispatch_uid=f"durableruns-metrics-{id(self)}")
        signals.step_in_doubt.connect(self._in_doubt, weak=False, dispatch_uid=f"durableruns-metrics-{id(self)}")

    def _failed(self, **_: Any) -> None:
        self.failed.inc()

    def _in_doubt(self, **_: Any) -> None:
        self.in_doubt.inc()

    def outcome(self, outcome: Any) -> None:
        """Count one run's outcome (services.resume_due's on_outcome)."""
        with self._lock:
            self.runs.labels(status=outcome.status).inc()
            self.steps.inc(outcome.steps_run)

    def pass_done(self, report: Any) -> None:
        with self._lock:
            self.passes.observe(report.seconds)
            if report.crashed:
                self.raised.inc(len(report.crashed))

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve the counters at http://addr:port/metrics from a daemon thread."""
        from prometheus_client import start_http_server

        start_http_server(port, addr=addr, registry=self.registry)

    def observing(self, line: Callable[[Any], None]) -> Callable[[Any], None]:
        """`line` (what the command prints per run), counting each outcome first."""

        def both(outcome: Any) -> None:
            self.outcome(outcome)
            line(outcome)

        return both


def serve_worker(port: int | None) -> WorkerMetrics | None:
    """For `resume_runs --metrics-port`: the worker's counters served on `port` (loopback), or None without."""
    if port is None:
        return None
    metrics = WorkerMetrics()
    metrics.listen()
    metrics.serve(port)
    return metrics
