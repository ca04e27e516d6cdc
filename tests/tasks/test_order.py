"""The order due tasks start in, one on SQLite and PostgreSQL (issue 30): higher priority first; among equals the
one due first (a deferred task at its run_after, any other at its enqueue); then the one enqueued first. Run on
both engines (DATABASE_URL=sqlite:///... and postgres://...)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

from durableruns import services, store
from durableruns.models import RunStep
from tests.conftest import wait_until
from tests.tasks import jobs

pytestmark = [pytest.mark.django_db(transaction=True)]


def started_order(ids: list[str]) -> list[str]:
    services.resume_due(concurrency=1)
    steps = RunStep.objects.filter(run_id__in=ids, attempt=1).order_by("started_at")
    return list(steps.values_list("run_id", flat=True))


def test_equal_priorities_start_in_the_order_they_came_due():
    now = store.DATABASE.now()
    late = jobs.add.using(run_after=now + timedelta(seconds=0.6)).enqueue(1, 0).id  # enqueued first, due last
    early = jobs.add.using(run_after=now + timedelta(seconds=0.3)).enqueue(2, 0).id
    ready = jobs.add.enqueue(3, 0).id  # due as it is enqueued, before either deferred one
    urgent = jobs.add.using(priority=5).enqueue(4, 0).id  # enqueued last
    wait_until(
        lambda: store.DATABASE.now() >= now + timedelta(seconds=0.6),
        timeout=10,
        what="every run_after on the database's clock",
    )
    assert started_order([late, early, ready, urgent]) == [urgent, ready, early, late]


def test_tasks_due_at_the_same_moment_start_in_the_order_they_were_enqueued():
    at = store.DATABASE.now() + timedelta(seconds=0.3)
    ids = [jobs.add.using(run_after=at).enqueue(n, 0).id for n in range(4)]
    with transaction.atomic():  # enqueued in one transaction: still each at its own moment, in order
        ids += [jobs.add.enqueue(n, 0).id for n in range(4, 8)]
    results = [jobs.add.get_result(i) for i in ids[4:]]
    assert [r.enqueued_at for r in results] == sorted(r.enqueued_at for r in results)
    assert len({r.enqueued_at for r in results}) == 4
    wait_until(lambda: store.DATABASE.now() >= at, timeout=10, what="the run_after on the database's clock")
    # the four enqueued in the transaction were due as they were enqueued, before the deferred four's run_after
    assert started_order(ids) == ids[4:] + ids[:4]
