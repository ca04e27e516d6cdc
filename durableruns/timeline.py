"""A run's story as its record tells it: its attempts' transitions, each step's latest progress, its waits and
its end, as ordered entries with stable ids, for the events stream and the run page's live update.

Nothing here writes: every entry is derived from times the record already holds (an attempt's started_at,
finished_at and raised_at, its progress_at, the run's updated_at once it waits or ends), all on the database's
clock, so the hot path pays nothing for it and a new worker's writes after a crash appear like any other's.

An entry's id is "<microseconds>.<rank>.<attempt>.<step>": its moment, then a rank ordering what one commit
records together (a result before the next step's start, progress after, the run's own state last), so ids sort
as the run moved, and reading the record again gives every entry the same id.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone

from durableruns.models import RunState, RunStatus, RunStep

ENDED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})
ACTIVE = frozenset({RunStatus.PENDING, RunStatus.RUNNING})
_RUN_EVENTS: dict[str, str] = {RunStatus.WAITING: "waiting", RunStatus.NEEDS_DECISION: "needs_decision"}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Key = tuple[int, int, int, str]


@dataclass(frozen=True, order=True)
class Entry:
    """One event of the run: `kind` (started, completed, failed, raised, progress, waiting, needs_decision, end)
    and what it says (`data`, JSON)."""

    key: Key
    kind: str = field(compare=False)
    data: dict[str, Any] = field(compare=False)

    @property
    def id(self) -> str:
        micros, rank, attempt, step = self.key
        return f"{micros}.{rank}.{attempt}.{step}"


def parse_id(text: str) -> Key:
    """The key of an entry's id (ValueError if it is not one)."""
    micros, rank, attempt, step = text.strip().split(".", 3)
    return int(micros), int(rank), int(attempt), step


def _micros(moment: datetime) -> int:
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_default_timezone())
    delta = moment - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _at(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def progress_of(step: RunStep) -> dict[str, Any]:
    """What `step`'s attempt last said with ctx.progress, as the API and the stream show it."""
    return {
        "step": step.step,
        "message": step.progress_message,
        "done": step.progress_done,
        "total": step.progress_total,
        "at": step.progress_at,
    }


def latest_of(attempts: Iterable[RunStep]) -> dict[str, Any] | None:
    """The latest progress report among `attempts` (a run's, as read), or None if no step reported any."""
    reported = [a for a in attempts if a.progress_at is not None]
    if not reported:
        return None
    return progress_of(max(reported, key=lambda a: (a.progress_at, a.attempt)))


def latest_progress(run_id: str) -> dict[str, Any] | None:
    """The run's latest progress report (of any attempt), or None if no step reported any."""
    return latest_of(RunStep.objects.filter(run_id=run_id, progress_at__isnull=False).only(*ATTEMPT_FIELDS))


def entries(run: RunState, attempts: list[RunStep]) -> list[Entry]:
    """Every entry of the run as `run` and its `attempts` (as read together) record it, in id order."""
    out: list[Entry] = []
    for a in attempts:
        base = {"step": a.step, "attempt": a.attempt}
        out.append(Entry((_micros(a.started_at), 2, a.attempt, a.step), "started", base))
        if a.finished_at is not None and a.status in ("completed", "failed"):
            extra = {"resolution": a.resolution} if a.status == "completed" else {"error": a.error}
            out.append(Entry((_micros(a.finished_at), 1, a.attempt, a.step), a.status, {**base, **extra}))
        if a.raised_at is not None:
            error = a.error_detail.splitlines()[-1] if a.error_detail else ""
            out.append(Entry((_micros(a.raised_at), 1, a.attempt, a.step), "raised", {**base, "error": error}))
        if a.progress_at is not None:
            report = {**progress_of(a), "attempt": a.attempt, "at": _at(a.progress_at)}
            out.append(Entry((_micros(a.progress_at), 3, a.attempt, a.step), "progress", report))
    kind = "end" if run.status in ENDED else _RUN_EVENTS.get(run.status)
    if kind is not None:
        # After all the run recorded: on SQLite one commit's times are read one by one, so its own may be earlier.
        last = max([_micros(run.updated_at), *(e.key[0] for e in out)])
        out.append(
            Entry(
                (last, 4, 0, ""),
                kind,
                {"status": run.status, "reason": run.reason, "wake_at": _at(run.wake_at)},
            )
        )
    return sorted(out)


ATTEMPT_FIELDS = (
    "run_id",
    "step",
    "attempt",
    "status",
    "started_at",
    "finished_at",
    "raised_at",
    "error",
    "error_detail",
    "resolution",
    "progress_message",
    "progress_done",
    "progress_total",
    "progress_at",
)


def read(run_id: str) -> tuple[RunState | None, list[Entry]]:
    """The run (None if it is gone) and its entries, read now."""
    run = RunState.objects.filter(pk=run_id).only("run_id", "status", "reason", "wake_at", "updated_at").first()
    if run is None:
        return None, []
    attempts = list(RunStep.objects.filter(run_id=run_id).only(*ATTEMPT_FIELDS))
    return run, entries(run, attempts)
