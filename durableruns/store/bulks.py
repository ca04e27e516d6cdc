"""A bulk act's record (durableruns.bulks): the bulk and its frozen list of runs in one commit, and the items
workers take, each acted on in the very commit that marks it done.

The list is one INSERT ... SELECT of the filter's query, so a bulk of thousands of runs is one statement and the
API answers at once. A worker takes a batch of pending items with SKIP LOCKED (several workers share a bulk, none
waits for another), and acts on each inside a savepoint of the batch's commit: a SIGKILL anywhere before that
commit leaves every item of the batch pending and every run as it was, so each run is acted on exactly once in
the end. An act that is refused (the run no longer fits) rolls back its savepoint only, and its item is skipped
with the refusal as its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import Count, QuerySet

from durableruns import conf
from durableruns.bulk_models import Bulk, BulkItem, BulkItemState
from durableruns.clock import Clock
from durableruns.distribution import on_one_node
from durableruns.errors import DurableRunsError
from durableruns.store.base import DATABASE
from durableruns.store.sql import one

log = logging.getLogger("durableruns")

# What an act hands back to run once its batch has committed (signals: receivers read a committed record).
After = Callable[[], None]
Act = Callable[[Bulk, BulkItem, datetime], After | None]
Prepare = Callable[[dict[str, Bulk], list[BulkItem]], None]

# An idle look on PostgreSQL: one probe of the pending items' partial index, prepared like the hot path's
# statements, so a pass that finds nothing pending (nearly every pass) pays its round trip and no query building.
_ANY_PENDING = f"SELECT EXISTS (SELECT 1 FROM run_bulk_item WHERE state = '{BulkItemState.PENDING.value}')"


def create_bulk(*, bulk_id: str, action: str, chosen: QuerySet[Any, Any], filter: dict[str, Any], note: str,
                decided_by: str, user_id: int | None, from_step: str = "", outcome: str = "",
                clock: Clock = DATABASE) -> int:
    """Record a bulk and its items in one commit: one item per row of `chosen`, a query of the runs' ids (or, for
    a decision bulk, of escalations' run_id and id, in that order), frozen now; return how many.

    One INSERT ... SELECT: the matching rows never travel to this process."""
    alias = conf.database()
    sql, params = chosen.using(alias).order_by().query.sql_with_params()
    escalation = "chosen.id" if action == Bulk.Action.DECIDE else "NULL"
    table = connections[alias].ops.quote_name(BulkItem._meta.db_table)
    with transaction.atomic(using=alias, durable=True):
        Bulk.objects.using(alias).create(
            bulk_id=bulk_id, action=action, filter=filter, from_step=from_step, outcome=outcome, note=note,
            decided_by=decided_by, user_id=user_id, created_at=clock.expression())
        with connections[alias].cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (bulk_id, run_id, escalation_id, state, reason) "
                f"SELECT %s, chosen.run_id, {escalation}, %s, '' FROM ({sql}) AS chosen",
                [bulk_id, BulkItemState.PENDING, *params])
            total = int(cursor.rowcount)
        Bulk.objects.using(alias).filter(pk=bulk_id).update(total=total)
    return total


@dataclass
class Batch:
    """What one take did: how many items it acted on and skipped."""

    done: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (run_id, reason)

    @property
    def taken(self) -> int:
        return self.done + len(self.skipped)


def act_on_pending(act: Act, *, batch: int = 50, clock: Clock = DATABASE, prepare: Prepare | None = None) -> Batch:
    """Take up to `batch` pending items of any bulk (oldest first, those another worker holds skipped) and act on
    each with `act(bulk, item, now)` in one commit that also marks it done, or skipped with the reason `act`
    raised (a DurableRunsError: the run no longer fits, or the act was refused). What `act` returns is run
    once that commit is made. `prepare(bulks, items)`, if given, is called first inside the commit (to read
    what the batch's acts share in one query). An empty Batch: nothing is pending that no other worker holds."""
    alias = conf.database()
    taken = Batch()
    after: list[After] = []
    if not _any_pending():  # an idle worker's look: one index probe, no commit
        return taken
    with transaction.atomic(using=alias, durable=True):
        now = clock.now()
        items = list(BulkItem.objects.using(alias).select_for_update(skip_locked=True).pending()[:batch])
        if not items:
            return taken
        bulks = {b.pk: b for b in Bulk.objects.using(alias).filter(pk__in={i.bulk_id for i in items})}
        if prepare is not None:
            prepare(bulks, items)
        done: list[int] = []
        for item in items:
            try:
                with transaction.atomic(using=alias):  # a savepoint: a refused act leaves nothing behind
                    then = act(bulks[item.bulk_id], item, now)
            except DurableRunsError as exc:
                reason = str(exc)
            except Exception as exc:  # a bug on one run, not the others' business: skipped, said, and logged
                log.exception("bulk %s: acting on run %s raised", item.bulk_id, item.run_id)
                reason = f"raised {type(exc).__name__}: {exc}"
            else:
                done.append(item.pk)
                if then is not None:
                    after.append(then)
                continue
            BulkItem.objects.using(alias).filter(pk=item.pk).update(
                state=BulkItemState.SKIPPED, reason=reason[:2000], acted_at=now)
            taken.skipped.append((item.run_id, reason[:2000]))
        # the acted-on items in one statement, still inside the commit that made their acts
        BulkItem.objects.using(alias).filter(pk__in=done).update(state=BulkItemState.DONE, acted_at=now)
        taken.done = len(done)
    for then in after:
        then()
    return taken


def _any_pending() -> bool:
    alias = conf.database()
    if on_one_node(alias):  # a read: inside a transaction too, unlike the hot path's writes (store.base.fast)
        return bool(one(_ANY_PENDING, {})[0])
    return BulkItem.objects.using(alias).pending().exists()


def bulk_progress(bulk_id: str) -> tuple[Bulk, int, int, list[tuple[str, str]]]:
    """The bulk, how many items are done or skipped, how many are still pending, and the skipped (run_id, reason)
    in the order taken. Raises Bulk.DoesNotExist."""
    alias = conf.database()
    bulk = Bulk.objects.using(alias).get(pk=bulk_id)
    counts = dict(BulkItem.objects.using(alias).filter(bulk_id=bulk_id).order_by().values("state")
                  .annotate(n=Count("pk")).values_list("state", "n"))
    skipped = list(BulkItem.objects.using(alias).filter(bulk_id=bulk_id).skipped().values_list("run_id", "reason"))
    pending = counts.get(BulkItemState.PENDING, 0)
    return bulk, bulk.total - pending, pending, skipped
