"""Delete finished runs past their retention period: what cron calls once a day. Safe to run beside workers."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from durableruns.errors import InvalidInput
from durableruns.ops import prune


def _statuses(text: str) -> tuple[str, ...]:
    chosen = tuple(s.strip() for s in text.split(",") if s.strip())
    wrong = [s for s in chosen if s not in prune.FINISHED]
    if wrong or not chosen:
        raise ValueError(text)
    return chosen


_statuses.__name__ = "status list"


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(text)
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(text)
    return value


class Command(BaseCommand):
    help = (
        "Delete finished runs (completed, cancelled, failed) older than --older-than days by their finish time, "
        "with their attempts, escalations and decisions, in batches. Never touches a pending, running, waiting "
        "or needs-decision run. Runs ever escalated or touched by staff are kept for "
        "DURABLERUNS_PRUNE_EVIDENCE_DAYS (365 by default)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--older-than", type=_non_negative, default=None, metavar="DAYS",
                            help="Age in days since the run finished (default DURABLERUNS_PRUNE_DAYS, 30).")
        parser.add_argument("--status", type=_statuses, default=prune.FINISHED, metavar="completed,cancelled,failed",
                            help="Which finished statuses to prune, comma-separated (default all three).")
        parser.add_argument("--dry-run", action="store_true", help="Print what would go; delete nothing.")
        parser.add_argument("--batch-size", type=_positive, default=1000, metavar="N",
                            help="Runs per batch, each its own short transaction (default 1000).")
        parser.add_argument("--archive", metavar="FILE", default=None,
                            help="Append every pruned run, its attempts and decisions to FILE as JSON lines, "
                                 "fsynced before the batch's delete commits.")

    def handle(self, *args: Any, older_than: float | None, status: tuple[str, ...], dry_run: bool,
               batch_size: int, archive: str | None, verbosity: int, **options: Any) -> None:
        try:
            out = open(archive, "a", encoding="utf-8") if archive and not dry_run else None  # noqa: SIM115
        except OSError as exc:
            raise CommandError(f"cannot write the archive {archive}: {exc.strerror or exc}; nothing deleted") from None
        try:
            report = prune.prune(older_than_days=older_than, statuses=status, batch_size=batch_size,
                                 archive=out, dry_run=dry_run,
                                 on_batch=self._progress if verbosity > 1 and not dry_run else None)
        except InvalidInput as exc:
            raise CommandError(str(exc)) from None
        finally:
            if out is not None:
                out.close()
        if dry_run and verbosity > 1:
            for run_id in report.run_ids:
                self.stdout.write(f"would delete {run_id}")
        self.stdout.write(report.summary())

    def _progress(self, report: prune.PruneReport) -> None:
        self.stdout.write(f"batch {report.batches}: {report.runs} run(s) so far")
