"""Resume due runs: what cron calls. Safe under overlap: a run held by another worker is skipped."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from django.core.checks import Tags
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, InterfaceError, OperationalError
from django.utils import timezone

from durableruns import checks, conf, connections, services
from durableruns.clock import Clock, host_skew, on_postgresql
from durableruns.models import RunState
from durableruns.ops import metrics, replication
from durableruns.passes import RunOutcome
from durableruns.worker.pool import Stopping, Waker


def _leased() -> str:
    """With nothing due, what holds the runs left: live leases (a killed worker's too, until it runs out), e.g.
    "1 run leased until 14:07:12" (this site's TIME_ZONE; the database's clock)."""
    held = RunState.objects.leased(Clock().now())
    count = held.count()
    first = held.order_by("lease_expires_at").values_list("lease_expires_at", flat=True).first()
    if not count or first is None:
        return ""
    until = timezone.localtime(first).strftime("%H:%M:%S")
    return f"1 run leased until {until}" if count == 1 else f"{count} runs leased, the first until {until}"


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise ValueError(text)
        return value

    parse.__name__ = kind.__name__
    return parse


class Command(BaseCommand):
    help = (
        "Claim and work due runs: new ones, ones whose lease expired, waiting ones whose time has come, and ones "
        "whose escalation was decided. Runs left waiting or needing a decision are outcomes, not errors."
    )
    # durableruns' own checks (an error, such as USE_TZ = False, stops the command before it claims anything) and
    # the models', as collectstatic runs the staticfiles checks alone: not the site's template and URL checks,
    # which import every template tag library and the whole URLconf (a third of a process start) for a worker
    # that renders no page. `manage.py check` runs them all, and --skip-checks skips these too.
    requires_system_checks = [checks.TAG, Tags.models]

    def add_arguments(self, parser: Any) -> None:
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--once", action="store_true",
                          help="Work until nothing is due (or --max-seconds), then exit (the default, for cron).")
        mode.add_argument("--loop", action="store_true", help="Keep working as runs come due, until "
                          "--max-seconds or SIGTERM.")
        parser.add_argument("--interval", type=_positive(float), default=5.0,
                            help="Seconds an idle --loop worker waits before looking again (default 5).")
        parser.add_argument("--limit", type=_positive(int), default=None,
                            help="Take at most this many runs, then stop (default: no cap).")
        parser.add_argument("--concurrency", type=_positive(int), default=None,
                            help="Runs worked at once, each by a thread with its own database connection "
                                 "(default DURABLERUNS_CONCURRENCY, 4; always 1 on SQLite).")
        parser.add_argument("--run", dest="run_id", metavar="RUN_ID", help="Work only this run.")
        parser.add_argument("--dry-run", action="store_true",
                            help="Print each due run's boundary and what would be done; change nothing.")
        parser.add_argument("--worker", default=None, help="Owner name recorded on claims (default host:pid).")
        parser.add_argument("--max-seconds", type=_positive(float), default=None,
                            help="Stop claiming new runs after this many seconds.")
        parser.add_argument("--lease", type=_positive(float), default=None,
                            help="Lease length in seconds (default DURABLERUNS_LEASE_SECONDS, 30).")
        parser.add_argument("--queue", dest="queues", action="append", default=[], metavar="NAME",
                            help="Take only runs on this queue (repeatable; default: every queue).")
        parser.add_argument("--metrics-port", type=_positive(int), default=None, metavar="PORT",
                            help="Serve this worker's counters for Prometheus at http://127.0.0.1:PORT/metrics "
                                 "(needs durableruns[metrics]).")

    def handle(self, *args: Any, loop: bool, interval: float, limit: int | None, concurrency: int | None,
               run_id: str | None, dry_run: bool, worker: str | None, max_seconds: float | None,
               lease: float | None, metrics_port: int | None = None, queues: list[str] | None = None,
               **options: Any) -> None:
        if dry_run:
            try:
                self._preview(limit=limit, run_id=run_id, queues=queues or ())
            except (DatabaseError, InterfaceError) as exc:
                raise _stopped(exc) from exc
            return
        owner = worker or services.default_owner()
        lease = lease or conf.lease_seconds()
        connections.apply_timeouts(lease_seconds=lease)  # a cut-off worker gives up within about this lease
        threads = self._threads(concurrency)
        stopping = Stopping()
        _on_signals(stopping)
        counters = metrics.serve_worker(metrics_port)  # None without --metrics-port
        try:
            self._check_skew(lease)
            self._check_replication()
            report = services.resume_due(
                limit=limit, owner=owner, lease_seconds=lease, run_id=run_id, max_seconds=max_seconds,
                on_outcome=counters.observing(self._line) if counters else self._line,
                on_claim=counters.claimed if counters else None, concurrency=threads, stopping=stopping,
                waker=Waker() if loop else None, idle_seconds=interval, report_presence=True,
                grace=conf.shutdown_grace(), listen=loop, queues=queues or (),
                on_start=(lambda how: self.stdout.write(f"{owner}: working, lease {lease:g}s, {how}")) if loop
                else None)
        except (DatabaseError, InterfaceError) as exc:  # InterfaceError (a closed connection) is not a DatabaseError
            raise _stopped(exc) from exc
        if counters is not None:
            counters.pass_done(report)
        for run, error in report.crashed:
            self.stderr.write(f"{run}: raised {error}")
        if not report.outcomes:
            report.leased = _leased()
        self.stdout.write(report.summary())
        if report.crashed:
            raise CommandError(f"{len(report.crashed)} run(s) raised unexpectedly", returncode=3)

    def _threads(self, asked: int | None) -> int:
        if not on_postgresql():
            if asked is not None and asked > 1:
                self.stderr.write("SQLite has one writer at a time: working with 1 thread, not "
                                  f"{asked} (use PostgreSQL for concurrency)")
            return 1
        return asked or max(1, conf.concurrency())

    def _check_skew(self, lease: float) -> None:
        """Warn when this host's clock is far from the database's: durableruns decides by the database's clock
        alone, so nothing goes wrong, but a host that far off is misconfigured (its logs, its cron)."""
        skew = host_skew().total_seconds()
        if abs(skew) > lease / 3:
            side = "ahead of" if skew > 0 else "behind"
            self.stderr.write(
                f"warning: this host's clock is {abs(skew):.1f}s {side} the database's (more than a third of the "
                f"{lease:g}s lease). durableruns takes every lease and wake time from the database's clock, so "
                f"runs stay safe, but check this host's time synchronisation (NTP).")

    def _check_replication(self) -> None:
        """Warn when a failover could lose a commit PostgreSQL acknowledged (asynchronous standbys)."""
        risk = replication.risk_now()
        if risk is not None:
            self.stderr.write(f"warning: {risk}")

    def _line(self, outcome: RunOutcome) -> None:
        self.stdout.write(f"{outcome.run_id}: {outcome.status} - {outcome.detail}")

    def _preview(self, *, limit: int | None, run_id: str | None, queues: Any = ()) -> None:
        previews = services.preview_due(limit=limit or 100, run_id=run_id, queues=queues)
        for p in previews:
            self.stdout.write(f"{p.run_id}: {p.boundary}\n  would {p.would}")
        self.stdout.write(f"dry run: {len(previews)} run(s) due; nothing changed")


def _stopped(exc: DatabaseError | InterfaceError) -> CommandError:
    # A lost or unreachable server, or a connection closed under the worker, not an error in one run's data: say
    # so, for the operator.
    why = ("the database is unreachable or dropped the connection: " if isinstance(exc, OperationalError)
           else "the database connection was closed under the worker: " if isinstance(exc, InterfaceError) else "")
    return CommandError(
        f"database error, pass stopped: {why}{exc}".strip()
        + "\nEvery fact is its own transaction, so nothing is half recorded; the next pass resumes from the record.")


def _on_signals(stopping: Stopping) -> None:
    """SIGTERM / SIGINT: stop claiming, let the steps in hand finish (hand their runs back), exit 0. A second
    signal exits at once: the record is safe either way, a step cut short is in doubt and settled by its policy."""

    def on_signal(signum: int, frame: Any) -> None:
        if stopping.is_set():
            sys.stderr.write("second signal: exiting now\n")
            os._exit(128 + signum)
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(sig, on_signal)
        except ValueError:  # not the main thread (e.g. called from a test thread)
            pass
