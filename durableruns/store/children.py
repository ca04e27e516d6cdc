"""Child runs (durableruns.children): a run started by a step of another, and the wake of its parent's join."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef

from durableruns import conf, signals
from durableruns.clock import Clock
from durableruns.distribution import is_distributed
from durableruns.encoding import to_json
from durableruns.errors import InvalidInput
from durableruns.models import RunState, RunStatus
from durableruns.plans import Plan
from durableruns.store.attributes import write_attributes, write_many
from durableruns.store.base import DATABASE, Lease, decoded, fence, wake_workers
from durableruns.store.plans import record_plan

UNFINISHED = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.NEEDS_DECISION)


@dataclass(frozen=True, kw_only=True)
class NewChild:
    """A child run a step asked for (durableruns.children): what its row records."""

    run_id: str
    workflow: str
    plan: Plan
    input: dict[str, Any]
    concurrency_key: str | None = None  # its workflow's limit key, asked of its input once, as start() asks it
    deadline: timedelta | None = None  # its workflow's deadline, counted from its creation (durableruns.deadlines)
    on_deadline: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)  # its workflow's attributes, asked of its input once


def child_exists(child: NewChild, *, parent: str) -> bool:
    """Whether the child is in the record already (True), after comparing it with the one asked for: another
    workflow, input or parent under its run_id is InvalidInput. False: it is not recorded yet."""
    if not RunState.objects.filter(pk=child.run_id).exists():
        return False
    _same_child(child.run_id, parent=parent, workflow=child.workflow, input=child.input)
    return True


def record_children(lease: Lease, children: list[NewChild], clock: Clock) -> None:
    """Inside a step's result commit: insert the children it asked for, pending, their parent on them. A row
    that is there already (ON CONFLICT DO NOTHING) was compared when the step asked for it."""
    for plan in {c.plan.fingerprint: c.plan for c in children}.values():
        record_plan(plan, clock=clock)
    RunState.objects.bulk_create(
        [RunState(run_id=c.run_id, workflow=c.workflow, plan_fingerprint=c.plan.fingerprint, input=c.input,
                  status=RunStatus.PENDING, parent_id=lease.run_id, concurrency_key=c.concurrency_key,
                  created_at=clock.expression(), updated_at=clock.expression(), on_deadline=c.on_deadline,
                  deadline_at=None if c.deadline is None else clock.expression(c.deadline)) for c in children],
        ignore_conflicts=True)
    write_many({c.run_id: c.attributes for c in children if c.attributes})
    wake_workers()


def start_child(lease: Lease, *, run_id: str, workflow: str, plan: Plan, input: dict[str, Any],
                concurrency_key: str | None = None, deadline: timedelta | None = None, on_deadline: str | None = None,
                clock: Clock = DATABASE, attributes: dict[str, Any] | None = None) -> bool:
    """Record the pending child run `run_id` of the run `lease` holds, its parent recorded on it, in one commit
    fenced on the parent's epoch (a worker fenced out, the parent cancelled or taken over, starts nothing);
    return True if created, False if that child exists already with the same workflow and input (a step run
    again after a crash). Insert or compare: the primary key refuses a second child of that run_id, however
    concurrent; the same run_id with another workflow, input or parent is InvalidInput."""
    with transaction.atomic(using=conf.database(), durable=True):
        fence(lease, clock)
        created = False
        if not RunState.objects.filter(pk=run_id).exists():
            record_plan(plan, clock=clock)
            try:
                with transaction.atomic(using=conf.database()):
                    RunState.objects.create(
                        run_id=run_id, workflow=workflow, plan_fingerprint=plan.fingerprint, input=input,
                        status=RunStatus.PENDING, parent_id=lease.run_id, concurrency_key=concurrency_key,
                        created_at=clock.expression(), updated_at=clock.expression(), on_deadline=on_deadline,
                        deadline_at=None if deadline is None else clock.expression(deadline))
                    write_attributes(run_id, attributes or {})
                created = True
            except IntegrityError:  # a stale worker of the same parent made it first: compare with it
                pass
        if created:
            wake_workers()
        else:
            _same_child(run_id, parent=lease.run_id, workflow=workflow, input=input)
    if created:
        signals.send_on_commit(signals.run_started, RunState, run_id=run_id, workflow=workflow)  # signals
    return created


def _same_child(run_id: str, *, parent: str, workflow: str, input: dict[str, Any]) -> None:
    row = RunState.objects.filter(pk=run_id).values_list("parent_id", "workflow", "input").get()
    if row[0] != parent:
        raise InvalidInput(f"run {run_id} exists already and is not a child of {parent}: choose another key",
                           run_id=run_id)
    if row[1] != workflow or decoded(row[2]) != json.loads(to_json(input, what="the input")):
        raise InvalidInput(f"child run {run_id} was started with another workflow or input ({row[1]}): a key "
                           f"names one child; give another child another key", run_id=run_id)


def wake_parent(run_id: str, clock: Clock) -> None:
    """Inside the commit that ends the child run `run_id`: make its parent due at once if it waits (at its join)
    and no other child of it may still move, as this transaction sees them; idle workers are woken on commit.

    Children of one parent end without locking the parent's row (their ends would queue on it, one commit
    after another). Two last children ending together may each see the other still running, and neither wake
    the parent here: so a child that saw a sibling unfinished asks once more, in one statement after its own
    commit (wake_parent_after). The last child to commit asks after every other child's end committed, and its
    statement sees them all ended. Were it killed between its commit and that statement, the join's recheck
    (waits.JOIN_RECHECK) finds its children ended from the record alone."""
    parent = RunState.objects.filter(pk=run_id).values_list("parent_id", flat=True).first()
    if parent is None:
        return
    if is_distributed(conf.database()):
        # On Citus the parent may be on another node: waking it here would make the child's end a two-phase
        # commit. It is woken after the commit, in a transaction on its own shard (wake_parent_after).
        transaction.on_commit(functools.partial(wake_parent_after, parent, clock), robust=True)
        return
    if RunState.objects.filter(parent_id=parent).exclude(pk=run_id).unfinished().exists():
        transaction.on_commit(functools.partial(wake_parent_after, parent, clock), robust=True)
        return
    if RunState.objects.filter(pk=parent, status=RunStatus.WAITING).update(wake_at=clock.expression()):
        wake_workers()


def wake_parent_after(parent: str, clock: Clock) -> None:
    """After a child's end committed: one statement that makes the parent due if it waits and none of its
    children may still move. Its snapshot is taken after that commit; if the parent's own wait holds its row,
    the update waits for it and then finds it waiting.

    On Citus (durableruns.distribution) the children may be on every node: they are read first, across the
    shards, after that commit, and the parent is updated on its own shard if none may still move."""
    if is_distributed(conf.database()):
        if RunState.objects.filter(parent_id=parent, status__in=UNFINISHED).exists():
            return
        if RunState.objects.filter(pk=parent, status=RunStatus.WAITING).update(wake_at=clock.expression()):
            wake_workers()
        return
    woke = RunState.objects.filter(pk=parent, status=RunStatus.WAITING).exclude(
        Exists(RunState.objects.filter(parent_id=OuterRef("pk"), status__in=UNFINISHED))
    ).update(wake_at=clock.expression())
    if woke:
        wake_workers()
