"""Say which steps in hand have outlived their declared timeout: a step that blocks for ever holds its thread, and
an operator must be told which run, on which thread, since when, while the other threads go on working.

It reads the runs the heartbeat holds, so it sees exactly what this process has in hand, and ages each step on
the database's clock. Each such step is logged once, and kept for the pass's summary. At each look it also ends
the runs past their deadline that no claim will take (durableruns.deadlines.sweep): a run whose worker is inside a
long step is fenced out, as a staff cancel would fence it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DatabaseError, InterfaceError, connections

from durableruns import conf, deadlines, inbox
from durableruns.clock import Clock
from durableruns.errors import UnknownWorkflow
from durableruns.models import RunStep, StepStatus
from durableruns.passes import step_timeout
from durableruns.registry import get_workflow
from durableruns.worker.background import Background
from durableruns.worker.heartbeat import Heartbeat
from durableruns.worker.presence import Presence

log = logging.getLogger("durableruns")


@dataclass(frozen=True, kw_only=True)
class Outlived:
    """A step in hand past its timeout plus the margin."""

    run_id: str
    step: str
    attempt: int
    thread: str  # the owner the run was claimed under: host:pid#thread
    since: datetime
    timeout: timedelta

    def __str__(self) -> str:
        return (
            f"run {self.run_id}: {self.step} (attempt {self.attempt}) in hand on {self.thread} since "
            f"{self.since:%Y-%m-%d %H:%M:%S}, past its {self.timeout.total_seconds():g}s timeout"
        )


def outlived(leases_of: Heartbeat, *, clock: Clock, margin: timedelta) -> list[Outlived]:
    """The steps in hand (started under the epoch the process holds) older than their timeout plus `margin`."""
    held = {lease.run_id: lease for lease in leases_of.held()}
    if not held:
        return []
    now = clock.now()
    found = []
    rows = RunStep.objects.filter(run_id__in=list(held), status=StepStatus.STARTED).select_related("run")
    for row in rows:
        if row.epoch != held[row.run_id].epoch:  # an older attempt in doubt, not the one in hand
            continue
        try:
            timeout = step_timeout(get_workflow(row.run.workflow)[row.step])
        except (UnknownWorkflow, KeyError):
            continue
        if now - row.started_at > timeout + margin:
            found.append(
                Outlived(
                    run_id=row.run_id,
                    step=row.step,
                    attempt=row.attempt,
                    thread=row.owner,
                    since=row.started_at,
                    timeout=timeout,
                )
            )
    return found


class Watchdog(Background):
    """A thread that looks at the steps in hand every few seconds and logs each one past its timeout, once; and
    ends the runs past their deadline that no claim takes; and reminds of and moves the inbox's overdue items."""

    thread_name = "durableruns-watchdog"

    def __init__(
        self, heartbeat: Heartbeat, *, clock: Clock, margin: timedelta | None = None, presence: Presence | None = None
    ) -> None:
        super().__init__()
        self.heartbeat = heartbeat
        self.presence = presence  # reported at each look, so a health check sees the process alive
        self.clock = clock
        self.margin = conf.stuck_margin() if margin is None else margin
        self.every = max(0.5, min(10.0, self.margin.total_seconds() / 2))
        self.seen: dict[tuple[str, int], Outlived] = {}
        self._first = self.every  # the wait before the first look

    def start_looking(self) -> Watchdog:
        """Start the thread with its first look at once: its first interval passed before it was started (a pass
        has the heartbeat start it then, Heartbeat.after, so a shorter pass costs no thread)."""
        self._first = 0.0
        return self.start()

    def _run(self) -> None:
        wait = self._first
        try:
            while not self._stopped.wait(wait):
                wait = self.every
                if self.presence is not None:
                    self.presence.report()
                try:
                    found = outlived(self.heartbeat, clock=self.clock, margin=self.margin)
                except (DatabaseError, InterfaceError) as exc:  # the workers meet it too, and stop the pass
                    log.warning("watchdog: could not look at the steps in hand: %s", exc)
                    connections.close_all()
                    continue
                for step in found:
                    if (step.run_id, step.attempt) not in self.seen:
                        self.seen[(step.run_id, step.attempt)] = step
                        log.warning("%s; it holds that thread, the others go on", step)
                try:
                    deadlines.sweep(clock=self.clock)
                except (DatabaseError, InterfaceError) as exc:  # the next look sweeps again
                    log.warning("watchdog: could not end the runs past their deadline: %s", exc)
                    connections.close_all()
                try:
                    inbox.sweep(clock=self.clock)
                except (DatabaseError, InterfaceError) as exc:  # the next look reminds and moves again
                    log.warning("watchdog: could not remind of or move the inbox's overdue items: %s", exc)
                    connections.close_all()
        finally:
            connections.close_all()  # this thread's own
