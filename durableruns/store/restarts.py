"""A run restarted from a step (durableruns.restarts): the new run, what it copies of its source, and the staff act
on both runs, in one commit.

The new run keeps its source's effect keys (key_run_id: the original's run id, through every restart of a
restart), so a step that acts again acts under the key the far system already knows. Steps before the chosen one
are copied completed (resolution "copied"). A resolvable step the source attempted from the chosen one on gets a
started attempt carrying the source's key and the bound of the source's call: the engine's in-doubt path then
looks it up by that key before anything is called (found: completed with the far system's answer; absent once
the lookup's lag has passed: called, under the same key). An acquisition the source gave back is copied with its
releases, so the new run acquires it again under a key of its own (holdings.round_key).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError, transaction

from durableruns import conf, signals
from durableruns.encoding import storable
from durableruns.errors import DuplicateRun, InvalidInput, RunNotActionable, RunNotFound
from durableruns.models import Intervention, Resolution, RunState, RunStatus, RunStep, StepStatus
from durableruns.plans import Plan
from durableruns.store.base import DATABASE, ENDED, wake_workers
from durableruns.store.plans import record_plan

_COPIED = ("step", "attempt", "effect_key", "started_at", "finished_at", "result", "loop_cursor", "progress")


def record_restart(source_id: str, *, run_id: str, plan: Plan, from_step: str, resolvable: Sequence[str],
                   acquisitions: Sequence[tuple[str, str]], concurrency_key: str | None, decided_by: str,
                   user_id: int | None, note: str, bulk_id: str | None = None, clock: Any = DATABASE) -> str:
    """Record `run_id`, a restart of the ended run `source_id` from `from_step` under `plan`, and the staff act
    on both runs; return `run_id`. `resolvable`: the plan's resolvable steps; `acquisitions`: (step, its release
    step) of the plan's acquisitions. The source's row is locked first, so two restarts of one run are two runs,
    each from the record as it is, and no worker can end or move the source in between."""
    if from_step not in plan.names:  # before the plan is recorded
        raise InvalidInput(f"{from_step!r} is not a step of {plan.workflow}'s plan ({', '.join(plan.names)})",
                           step=from_step)
    record_plan(plan, clock=clock)  # its own commit, once per fingerprint and process
    try:
        with transaction.atomic(using=conf.database(), durable=True):
            restart_in_commit(source_id, run_id=run_id, plan=plan, from_step=from_step, resolvable=resolvable,
                              acquisitions=acquisitions, concurrency_key=concurrency_key, decided_by=decided_by,
                              user_id=user_id, note=note, bulk_id=bulk_id, now=clock.now())
    except IntegrityError:
        raise DuplicateRun(run_id=run_id) from None
    return run_id


def restart_in_commit(source_id: str, *, run_id: str, plan: Plan, from_step: str, resolvable: Sequence[str],
                      acquisitions: Sequence[tuple[str, str]], concurrency_key: str | None, decided_by: str,
                      user_id: int | None, note: str, now: Any, bulk_id: str | None = None) -> str:
    """Inside the caller's commit (record_restart's, or a bulk item's), with `plan` recorded already: record the
    restart at `now`, as record_restart says; return `run_id`."""
    names = plan.names
    if from_step not in names:
        raise InvalidInput(f"{from_step!r} is not a step of {plan.workflow}'s plan ({', '.join(names)})",
                           step=from_step)
    start = names.index(from_step)
    source = RunState.objects.select_for_update().filter(pk=source_id).first()
    if source is None:
        raise RunNotFound(run_id=source_id)
    if source.status not in ENDED or source.ending:
        raise RunNotActionable(f"only a run that has ended (completed, failed, cancelled) can be restarted; "
                               f"this one is {source.status}", run_id=source_id, status=source.status)
    if source.workflow != plan.workflow:
        raise InvalidInput(f"run {source_id} is of {source.workflow}, not {plan.workflow}", run_id=source_id)
    attempts = list(RunStep.objects.of_run(source_id).order_by("step", "attempt"))
    done = [a for a in attempts if a.status == StepStatus.COMPLETED]
    for name in names[:start]:
        if not any(a.step == name for a in done):
            raise InvalidInput(f"step {name} has no completed result in run {source_id}: restart from "
                               f"{name} or an earlier step", run_id=source_id, step=name)
    copied = [a for a in done if a.step in names[:start]]
    given_back = {step for step, release in acquisitions
                  if 0 < _count(done, step) <= _count(done, release)}
    for step, release in acquisitions:
        if step in given_back:  # its holding, then its release: the new run acquires it again
            copied += [a for a in done if a.step == release or (a.step == step and step not in names[:start])]
    RunState.objects.create(
        run_id=run_id, workflow=source.workflow, plan_fingerprint=plan.fingerprint, status=RunStatus.PENDING,
        cursor=start, input=source.input, priority=source.priority, queue=source.queue,
        concurrency_key=concurrency_key, restarted_from=source_id, restarted_step=from_step,
        key_run_id=source.key_run_id or source_id, created_at=now, updated_at=now,
        reason=storable(f"restart by {decided_by} of {source_id} from {from_step}: {note}"),
    )
    rows = [RunStep(run_id=run_id, status=StepStatus.COMPLETED, resolution=Resolution.COPIED,
                    owner=f"copied from {source_id}"[:200], **{f: getattr(a, f) for f in _COPIED})
            for a in copied]
    for name in names[start:]:
        tried = [a for a in attempts if a.step == name]
        if name in resolvable and tried and name not in given_back:
            rows.append(_look_up_first(run_id, tried[-1]))
    RunStep.objects.bulk_create(rows)
    act = {"step": from_step, "action": Intervention.Action.RESTART, "decided_by": decided_by,
           "user_id": user_id, "decided_at": now, "note": note, "bulk_id": bulk_id}
    Intervention.objects.create(run_id=source_id, result={"restarted_as": run_id, "bulk_id": bulk_id}, **act)
    Intervention.objects.create(run_id=run_id, result={"restarted_from": source_id, "bulk_id": bulk_id}, **act)
    wake_workers()
    signals.send_on_commit(signals.run_started, RunState, run_id=run_id, workflow=plan.workflow)  # signals
    return run_id


def _count(attempts: Sequence[RunStep], step: str) -> int:
    return sum(a.step == step for a in attempts)


def _look_up_first(run_id: str, latest: RunStep) -> RunStep:
    """A started attempt of the new run under the source's key, in doubt as the source's latest attempt left it:
    its call was over when it returned or failed (finished_at), or may have been made until the lease its worker
    held ran out (held_until), the bound the lookup's lag counts from."""
    over = latest.raised_at if latest.status == StepStatus.STARTED else latest.finished_at
    return RunStep(run_id=run_id, step=latest.step, attempt=1, status=StepStatus.STARTED,
                   effect_key=latest.effect_key, started_at=latest.started_at, renewed_at=latest.renewed_at,
                   held_until=latest.held_until, raised_at=over, epoch=0)
