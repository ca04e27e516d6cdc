"""Retention: delete finished runs, with their attempts, escalations and decisions, once they are old enough.

A finished run's finish time is its run_state.updated_at: every write to a run sets it, and once a run is
completed, cancelled or failed no worker writes to it again (a staff retry makes it pending, and so active, again).
Runs ever escalated or touched by staff are evidence of who decided what, and are kept for a longer period.

A pass walks run_state by its primary key (keyset pagination: each batch starts after the last run it took), so
the whole pass reads each row once whatever the table's size, and no index is added on updated_at (which every
step rewrites: an index on it would cost every step its heap-only update). Each batch is its own transaction: it
locks the runs it takes (skipping any row another transaction holds, and re-checking that each is still finished
and old enough), archives them if asked (written and fsynced before the delete commits), deletes them children
first, and commits. No lock outlives a batch; an active run is never selected, since the selection names only
finished statuses.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import IO, Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet

from durableruns import conf, store
from durableruns.clock import Clock
from durableruns.distribution import is_distributed
from durableruns.errors import InvalidInput
from durableruns.models import Escalation, Intervention, RunAttribute, RunState, RunStatus, RunStep
from durableruns.store.spread import lock_runs

FINISHED: tuple[str, ...] = (RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.FAILED)


@dataclass(kw_only=True)
class PruneReport:
    """What a pass deleted (or, in a dry run, would delete)."""

    dry_run: bool
    cutoff: datetime
    evidence_cutoff: datetime
    runs: int = 0
    attempts: int = 0
    escalations: int = 0
    interventions: int = 0
    attributes: int = 0  # run_attribute rows deleted with their runs (durableruns.attributes)
    inbox_items: int = 0  # run_inbox_item rows deleted with their runs (durableruns.inbox)
    batches: int = 0
    seconds: float = 0.0
    by_status: dict[str, int] = field(default_factory=dict)
    run_ids: list[str] = field(default_factory=list)  # filled in a dry run only, for --verbosity 2

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        statuses = ", ".join(f"{n} {s}" for s, n in sorted(self.by_status.items())) or "none"
        text = (
            f"{verb} {self.runs} run(s) ({statuses}), {self.attempts} attempt(s), {self.escalations} "
            f"escalation(s), {self.interventions} decision(s) in {self.batches} batch(es), "
            f"{self.seconds:.2f}s; finished before {self.cutoff:%Y-%m-%d %H:%M:%S}, escalated or touched by "
            f"staff before {self.evidence_cutoff:%Y-%m-%d %H:%M:%S}"
        )
        return f"dry run: {text}; nothing deleted" if self.dry_run else text


def prunable(*, cutoff: datetime, evidence_cutoff: datetime, statuses: Sequence[str] = FINISHED) -> QuerySet[RunState]:
    """Finished runs (of `statuses`) whose finish is before `cutoff`, or before `evidence_cutoff` for a run that
    was escalated or touched by staff."""
    evidence = Exists(Escalation.objects.filter(run_id=OuterRef("pk"))) | Exists(
        Intervention.objects.filter(run_id=OuterRef("pk"))
    )
    return RunState.objects.filter(status__in=list(statuses)).filter(
        Q(updated_at__lt=evidence_cutoff) | (Q(updated_at__lt=cutoff) & ~evidence)
    )


def prune(
    *,
    older_than_days: float | None = None,
    statuses: Sequence[str] = FINISHED,
    batch_size: int = 1000,
    archive: IO[str] | None = None,
    dry_run: bool = False,
    clock: Clock | None = None,
    on_batch: Callable[[PruneReport], None] | None = None,
) -> PruneReport:
    """Delete (or with `dry_run` count) finished runs older than `older_than_days` (DURABLERUNS_PRUNE_DAYS by
    default) by their finish time, in batches of `batch_size`, each its own transaction; runs with an escalation
    or an intervention are kept for DURABLERUNS_PRUNE_EVIDENCE_DAYS (or the given period, if longer).

    With `archive`, every deleted run is first written there as one JSON line (the run, its attempts, its
    escalations and its decisions), flushed and fsynced before its batch's delete commits.
    """
    statuses = tuple(statuses)
    wrong = [s for s in statuses if s not in FINISHED]
    if wrong or not statuses:
        raise InvalidInput(f"only finished runs can be pruned ({', '.join(FINISHED)}), not {', '.join(wrong)}")
    if batch_size <= 0:
        raise InvalidInput("the batch size must be positive")
    days = conf.prune_days() if older_than_days is None else older_than_days
    if days < 0:
        raise InvalidInput("the period must not be negative")
    now = (clock or Clock()).now()  # the database's clock: the record's times are its
    report = PruneReport(
        dry_run=dry_run,
        cutoff=now - timedelta(days=days),
        evidence_cutoff=now - timedelta(days=max(days, conf.prune_evidence_days())),
    )
    selection = prunable(cutoff=report.cutoff, evidence_cutoff=report.evidence_cutoff, statuses=statuses)
    began = time.monotonic()
    after = ""
    # On Citus a batch spread over the shards cannot be locked by one SELECT: it is read without locks, then locked
    # shard by shard, skipping the runs another transaction holds (store.spread.lock_runs); the delete re-checks.
    spread = statuses if is_distributed(conf.database()) else ()
    while True:
        with transaction.atomic(using=conf.database(), durable=True):
            batch = selection.filter(pk__gt=after).order_by("pk")
            if not dry_run and not spread:
                batch = batch.select_for_update(skip_locked=True, of=("self",))
            rows = list(batch.values_list("pk", "status")[:batch_size])
            if not rows:
                break
            ids = [pk for pk, _ in rows]
            after = ids[-1]
            if spread and not dry_run:
                held = lock_runs(ids, spread)
                rows = [(pk, status) for pk, status in rows if pk in held]
                ids = [pk for pk, _ in rows]
            if dry_run:
                _count(report, ids)
                report.run_ids.extend(ids)
            elif ids:
                if archive is not None:
                    _archive(archive, ids)
                for counter, deleted in store.delete_runs(ids, finished=spread).items():
                    if counter != "runs":
                        setattr(report, counter, getattr(report, counter) + deleted)
            for _, status in rows:
                report.by_status[status] = report.by_status.get(status, 0) + 1
            report.runs += len(rows)
            report.batches += 1
        if on_batch is not None:
            on_batch(report)
    report.seconds = time.monotonic() - began
    return report


def _count(report: PruneReport, ids: list[str]) -> None:
    report.attempts += RunStep.objects.filter(run_id__in=ids).count()
    report.escalations += Escalation.objects.filter(run_id__in=ids).count()
    report.interventions += Intervention.objects.filter(run_id__in=ids).count()
    report.attributes += RunAttribute.objects.filter(run_id__in=ids).count()


def _fields(model: Any) -> list[str]:
    return [f.attname for f in model._meta.concrete_fields if getattr(f, "column", None)]


def _archive(out: IO[str], ids: list[str]) -> None:
    """Write each run of `ids` as one JSON line with its attempts, escalations and decisions; flush and fsync."""
    attempts: dict[str, list[dict[str, Any]]] = {}
    for row in (
        RunStep.objects.filter(run_id__in=ids)
        .order_by("run_id", "started_at", "step", "attempt")
        .values(*_fields(RunStep))
    ):
        attempts.setdefault(row["run_id"], []).append(row)
    escalations: dict[str, list[dict[str, Any]]] = {}
    for row in Escalation.objects.filter(run_id__in=ids).order_by("run_id", "opened_at").values(*_fields(Escalation)):
        escalations.setdefault(row["run_id"], []).append(row)
    decisions: dict[str, list[dict[str, Any]]] = {}
    for row in (
        Intervention.objects.filter(run_id__in=ids).order_by("run_id", "decided_at").values(*_fields(Intervention))
    ):
        decisions.setdefault(row["run_id"], []).append(row)
    attributes: dict[str, dict[str, str]] = {}
    for run_id, name, text in RunAttribute.objects.filter(run_id__in=ids).values_list("run_id", "name", "value_text"):
        attributes.setdefault(run_id, {})[name] = text
    for run in RunState.objects.filter(pk__in=ids).order_by("pk").values(*_fields(RunState)):
        run_id = run["run_id"]
        line = {
            "run": run,
            "attempts": attempts.get(run_id, []),
            "escalations": escalations.get(run_id, []),
            "interventions": decisions.get(run_id, []),
            "attributes": attributes.get(run_id, {}),
        }
        out.write(json.dumps(line, cls=DjangoJSONEncoder, ensure_ascii=False) + "\n")
    out.flush()
    try:
        os.fsync(out.fileno())
    except (AttributeError, OSError, ValueError):  # not a file (a StringIO in a caller's test): nothing to sync
        pass
