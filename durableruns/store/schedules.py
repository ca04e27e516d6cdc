"""Schedules (durableruns.schedules): the moment each one's slots count from, and the runs of its slots started
once under its row lock."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone as django_timezone

from durableruns import conf
from durableruns.clock import Clock
from durableruns.errors import DuplicateRun
from durableruns.models import ScheduleState
from durableruns.plans import Plan
from durableruns.store.base import DATABASE
from durableruns.store.runs import create_run


def schedule_marks(names: list[str], *, now: datetime) -> dict[str, datetime]:
    """Per schedule, the moment its next slots count from: its last slot started, or when a worker first saw it.
    A schedule seen for the first time is recorded now (`now`: the database's time, read by the caller), so the
    slots before it are never started. Aware datetimes."""
    def read() -> dict[str, datetime]:
        rows = ScheduleState.objects.filter(name__in=names).values_list("name", "last_slot", "created_at")
        return {name: _aware(last or created) for name, last, created in rows}

    marks = read()
    if len(marks) == len(names):  # every look but a new schedule's first: one read
        return marks
    stamp = _stored(now)
    ScheduleState.objects.bulk_create(
        [ScheduleState(name=name, last_slot=None, created_at=stamp, updated_at=stamp) for name in names
         if name not in marks],
        ignore_conflicts=True)  # another worker may record it first: its moment stands
    return read()


def start_slots(*, schedule: str, slots: list[tuple[datetime, str]], workflow: str, plan: Plan,
                input: dict[str, Any], clock: Clock = DATABASE, concurrency_key: str | None = None,
                deadline: timedelta | None = None, on_deadline: str | None = None,
                attributes: dict[str, Any] | None = None) -> list[str]:
    """Start the run of each (slot, run_id) later than the schedule's last slot, and record the latest as its
    last, in one commit under the schedule's row lock; return the run_ids started.

    Workers racing for the same slots queue on the lock, and the one that comes second finds them recorded. A
    slot's run that exists already (its run_id is the slot's) is never started twice: the primary key refuses it.
    """
    started: list[str] = []
    with transaction.atomic(using=conf.database(), durable=True):
        row = ScheduleState.objects.select_for_update().filter(pk=schedule).values_list("last_slot", flat=True)
        last = _aware(row[0]) if row and row[0] is not None else None
        fresh = [(slot, run_id) for slot, run_id in slots if last is None or slot > last]
        if not fresh:
            return started
        for _, run_id in fresh:
            try:
                create_run(run_id=run_id, workflow=workflow, plan_fingerprint=plan.fingerprint, input=input,
                           clock=clock, plan=plan, concurrency_key=concurrency_key, deadline=deadline,
                           on_deadline=on_deadline, attributes=attributes)
            except DuplicateRun:
                continue
            started.append(run_id)
        ScheduleState.objects.filter(pk=schedule).update(last_slot=_stored(max(slot for slot, _ in fresh)),
                                                         updated_at=clock.expression())
    return started


def _stored(value: datetime) -> datetime:
    """An aware datetime as Django stores it: aware with USE_TZ, else naive in the default time zone."""
    if settings.USE_TZ:
        return value
    return django_timezone.make_naive(value, django_timezone.get_default_timezone())


def _aware(value: datetime) -> datetime:
    if django_timezone.is_aware(value):
        return value
    return django_timezone.make_aware(value, django_timezone.get_default_timezone())
