"""A step's progress (ctx.progress): its latest message, done and total, committed at once on the started
attempt's row, fenced on the lease epoch, with its PostgreSQL statement.

Not the hot path: durableruns.progress commits at most once a second per step, and only for a step that calls it.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction

from durableruns import conf
from durableruns.clock import Clock
from durableruns.errors import FencedOut
from durableruns.models import RunStep, StepStatus
from durableruns.store.base import DATABASE, Lease, fast, fence, lease_times
from durableruns.store.sql import rowcount

_PROGRESS = """
WITH fence AS (
  UPDATE run_state SET updated_at = now() + %(shift)s, lease_expires_at = now() + %(shift)s + %(lease)s
   WHERE run_id = %(run)s AND epoch = %(epoch)s
     AND EXISTS (SELECT 1 FROM run_step
                  WHERE run_id = %(run)s AND step = %(step)s AND attempt = %(attempt)s AND status = 'started')
  RETURNING run_id)
UPDATE run_step SET progress_message = %(message)s, progress_done = %(done)s, progress_total = %(total)s,
       progress_at = now() + %(shift)s
 WHERE run_id = %(run)s AND step = %(step)s AND attempt = %(attempt)s AND status = 'started'
   AND EXISTS (SELECT 1 FROM fence)
"""


def record_progress(
    lease: Lease,
    *,
    step: str,
    attempt: int,
    message: str,
    done: int | None,
    total: int | None,
    clock: Clock = DATABASE,
) -> None:
    """Commit what the started attempt says of its progress, on the database's clock; FencedOut, writing
    nothing, if another worker took the run (or the attempt is no longer started)."""
    if fast():
        params = {
            "run": lease.run_id,
            "epoch": lease.epoch,
            "step": step,
            "attempt": attempt,
            "message": message,
            "done": done,
            "total": total,
            **lease_times(lease, clock),
        }
        if rowcount(_PROGRESS, params) != 1:
            raise FencedOut(
                f"stale epoch, or attempt {attempt} of {step} is no longer started",
                run_id=lease.run_id,
                epoch=lease.epoch,
            )
        return
    with transaction.atomic(using=conf.database(), durable=True):
        fence(lease, clock)
        moved = RunStep.objects.filter(
            run_id=lease.run_id, step=step, attempt=attempt, status=StepStatus.STARTED
        ).update(progress_message=message, progress_done=done, progress_total=total, progress_at=clock.expression())
        if not moved:
            raise FencedOut(f"attempt {attempt} of {step} is no longer started", run_id=lease.run_id, epoch=lease.epoch)


def reporter(
    lease: Lease, step: str, attempt: int, clock: Clock = DATABASE
) -> Callable[[str, int | None, int | None], None]:
    """What commits the progress of `attempt` of `step` (durableruns.progress.Progress), fenced on `lease`."""

    def write(message: str, done: int | None, total: int | None) -> None:
        record_progress(lease, step=step, attempt=attempt, message=message, done=done, total=total, clock=clock)

    return write
