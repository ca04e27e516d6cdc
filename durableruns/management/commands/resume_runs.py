"""Resume due runs: what cron calls. Safe under overlap: a run held by another worker is skipped."""

from __future__ import annotations

import signal
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from durableruns import conf, services
from durableruns.clock import host_skew
from durableruns.engine import RunOutcome
from durableruns.ops import metrics


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

    def add_arguments(self, parser: Any) -> None:
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--once", action="store_true", help="One pass, then exit (the default, for cron).")
        mode.add_argument("--loop", action="store_true", help="Pass after pass until --max-seconds or SIGTERM.")
        parser.add_argument("--interval", type=_positive(float), default=5.0,
                            help="Seconds to sleep in --loop when nothing was due (default 5).")
        parser.add_argument("--limit", type=_positive(int), default=100, help="Runs per pass (default 100).")
        parser.add_argument("--run", dest="run_id", metavar="RUN_ID", help="Work only this run.")
        parser.add_argument("--dry-run", action="store_true",
                            help="Print each due run's boundary and what would be done; change nothing.")
        parser.add_argument("--worker", default=None, help="Owner name recorded on claims (default host:pid).")
        parser.add_argument("--max-seconds", type=_positive(float), default=None,
                            help="Stop claiming new runs after this many seconds.")
        parser.add_argument("--lease", type=_positive(float), default=None,
                            help="Lease length in seconds (default DURABLERUNS_LEASE_SECONDS, 30).")
        parser.add_argument("--metrics-port", type=_positive(int), default=None, metavar="PORT",
                            help="Serve this worker's counters for Prometheus at http://127.0.0.1:PORT/metrics "
                                 "(needs durableruns[metrics]).")

    def handle(self, *args: Any, loop: bool, interval: float, limit: int, run_id: str | None, dry_run: bool,
               worker: str | None, max_seconds: float | None, lease: float | None, metrics_port: int | None = None,
               **options: Any) -> None:
        if dry_run:
            self._preview(limit=limit, run_id=run_id)
            return
        owner = worker or services.default_owner()
        lease = lease or conf.lease_seconds()
        try:
            self._check_skew(lease)
        except DatabaseError as exc:
            raise _stopped(exc) from exc
        counters = metrics.serve_worker(metrics_port)  # None without --metrics-port
        stopping = _StopFlag()
        began = time.monotonic()
        crashed = 0
        while True:
            remaining = None if max_seconds is None else max_seconds - (time.monotonic() - began)
            if remaining is not None and remaining <= 0:
                break
            try:
                report = services.resume_due(limit=limit, owner=owner, lease_seconds=lease, run_id=run_id,
                                             max_seconds=remaining,
                                             on_outcome=counters.observing(self._line) if counters else self._line,
                                             on_claim=counters.claimed if counters else None)
            except DatabaseError as exc:
                raise _stopped(exc) from exc
            if counters is not None:
                counters.pass_done(report)
            for run, error in report.crashed:
                self.stderr.write(f"{run}: raised {error}")
            crashed += len(report.crashed)
            if report.outcomes or report.crashed or not loop or options["verbosity"] > 1:
                self.stdout.write(report.summary())  # an idle --loop pass says nothing: logs stay readable
            if not loop or stopping.set or run_id:
                break
            if not report.outcomes and not report.crashed:
                stopping.sleep(interval if remaining is None else min(interval, remaining))
            if stopping.set:
                break
        if crashed:
            raise CommandError(f"{crashed} run(s) raised unexpectedly", returncode=3)

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

    def _line(self, outcome: RunOutcome) -> None:
        self.stdout.write(f"{outcome.run_id}: {outcome.status} - {outcome.detail}")

    def _preview(self, *, limit: int, run_id: str | None) -> None:
        previews = services.preview_due(limit=limit, run_id=run_id)
        for p in previews:
            self.stdout.write(f"{p.run_id}: {p.boundary}\n  would {p.would}")
        self.stdout.write(f"dry run: {len(previews)} run(s) due; nothing changed")


def _stopped(exc: DatabaseError) -> CommandError:
    return CommandError(
        f"database error, pass stopped: {exc}".strip()
        + "\nEvery fact is its own transaction, so nothing is half recorded; the next pass resumes from the record.")


class _StopFlag:
    """SIGTERM / SIGINT end --loop after the run in hand, never in the middle of a step."""

    def __init__(self) -> None:
        self.set = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread (e.g. called from a test thread)
                pass

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.set = True

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.set and time.monotonic() < end:
            time.sleep(min(0.1, end - time.monotonic()))
