"""Reads named in domain words; the admin, the API, the services and the commands call these, never raw filters."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.db import connections, models
from django.db.models import Case, F, Q, When
from django.db.models.functions import Coalesce

from durableruns import scopes
from durableruns.distribution import is_distributed


class RunStateQuerySet(models.QuerySet):
    ACTIVE = ("pending", "running", "waiting")

    def visible_to(self, user: Any) -> RunStateQuerySet:
        """The runs `user` may see: all but those of workflows scoped to groups the user is not in
        (DURABLERUNS_WORKFLOW_GROUPS, durableruns.scopes)."""
        hidden = scopes.hidden_workflows(user)
        return self.exclude(workflow__in=sorted(hidden)) if hidden else self

    def matching(self, filters: Mapping[str, Any]) -> RunStateQuerySet:
        """The runs a filter of GET /api/runs/ selects, parsed (api.requests.RunFilterSerializer): status, workflow,
        run_id, effect_key, waiting_for, and attr, a list of (name, value text) all of which must match exactly.
        The list and a bulk act both read through this, so they never disagree; blank values select all."""
        runs = self
        if filters.get("status"):
            runs = runs.filter(status=filters["status"])
        if filters.get("workflow"):
            runs = runs.filter(workflow=filters["workflow"])
        if filters.get("run_id"):
            runs = runs.filter(pk=filters["run_id"])
        if filters.get("effect_key"):
            runs = runs.having_effect_key(filters["effect_key"])
        if filters.get("waiting_for"):
            runs = runs.waiting_for(filters["waiting_for"])
        attributes = self.model._meta.apps.get_model("durableruns", "RunAttribute")._default_manager
        for name, value in filters.get("attr") or ():  # each pair one EXISTS through the (name, value_text) index
            runs = runs.filter(models.Exists(attributes.filter(run_id=models.OuterRef("pk"), name=name,
                                                               value_text=value)))
        return runs

    def due(self, now: datetime) -> RunStateQuerySet:
        """Runs a worker may take now: new or decided, lease expired, or waiting whose wake time has come."""
        return self.filter(status__in=self.ACTIVE).filter(
            Q(status="pending")
            | Q(status="running", lease_expires_at__lt=now)
            | Q(status="waiting", wake_at__lte=now)
        )

    def takeable(self, now: datetime) -> RunStateQuerySet:
        """Runs a worker may take when asked for by id: active and not held under a live lease, wake time or not."""
        return self.filter(status__in=self.ACTIVE).exclude(status="running", lease_expires_at__gte=now)

    def leased(self, now: datetime) -> RunStateQuerySet:
        """Runs held under a live lease: a worker has them (or had, and was killed: free again when it runs out)."""
        return self.filter(status="running", lease_expires_at__gte=now)

    def claimable(self, now: datetime, *, queues: tuple[str, ...] = ()) -> RunStateQuerySet:
        """Due runs (on `queues`, if given) in the claim's order, locked for the caller and skipped if another
        worker holds the lock."""
        due = self.due(now).filter(queue__in=queues) if queues else self.due(now)
        return due.in_claim_order().select_for_update(skip_locked=True)

    def in_claim_order(self) -> RunStateQuerySet:
        """The order every claim takes due runs in, PostgreSQL's statement (store.claims) and this ORM's alike:
        higher priority first; among equals the one due first (a woken run at its wake time, any other when it
        was recorded); then the one recorded first; then by run_id."""
        due_at = Case(When(status="waiting", then=F("wake_at")), default=F("created_at"))
        return self.alias(due_at=due_at).order_by("-priority", "due_at", "created_at", "run_id")

    def within_limits(self, limits: Mapping[str, int], now: datetime) -> RunStateQuerySet:
        """Leave out the runs their concurrency limit holds back: a limited run (of a workflow in `limits`, with
        a key recorded) not running yet, whose (workflow, key) has its limit of slots held already. A running
        run (its worker died) keeps its slot; so does a run someone else ended while its worker may be inside a
        call, until that worker lets go or the lease it had runs out (it records that lease). Exact only where
        claims do not race (SQLite's one writer); PostgreSQL's claim admits under a lock (store.claims)."""
        if not limits:
            return self
        holds = Q(status="running") | (Q(lease_expires_at__gt=now) & ~Q(run_id=models.OuterRef("run_id")))
        holding = (self.model._default_manager.filter(holds, workflow=models.OuterRef("workflow"),
                                                      concurrency_key=models.OuterRef("concurrency_key"))
                   .order_by().values("workflow").annotate(n=models.Count("pk")).values("n"))
        full = Q()
        for workflow, limit in limits.items():
            full |= Q(workflow=workflow, limit_holding__gte=limit)
        return (self.alias(limit_holding=Coalesce(models.Subquery(holding), 0))
                .exclude(Q(concurrency_key__isnull=False) & ~Q(status="running") & full))

    def with_attempts(self) -> RunStateQuerySet:
        """Runs with all their attempts in one extra query: what each run's boundary and sentence need."""
        return self.prefetch_related("attempts")

    def newest_first(self) -> RunStateQuerySet:
        return self.order_by("-created_at")

    def unfinished(self) -> RunStateQuerySet:
        """Runs that may still move: active, or stopped for staff."""
        return self.filter(status__in=RunPlanQuerySet.UNFINISHED)

    def children_of(self, run_id: str) -> RunStateQuerySet:
        """The child runs `run_id` started (ctx.start_run), in run_id order, through the parent index."""
        return self.filter(parent_id=run_id).order_by("run_id")

    def needing(self, step: str) -> RunStateQuerySet:
        """Runs that have not completed `step`."""
        attempts = self.model._meta.apps.get_model("durableruns", "RunStep")._default_manager
        return self.exclude(models.Exists(attempts.filter(run_id=models.OuterRef("pk"), step=step,
                                                          status="completed")))

    def of_plan(self, fingerprint: str) -> RunStateQuerySet:
        return self.filter(plan_fingerprint=fingerprint)

    def with_unrecorded_plan(self) -> RunStateQuerySet:
        """Runs whose plan is not recorded (started before plans were, under a plan no deploy has since)."""
        plans = self.model._meta.apps.get_model("durableruns", "RunPlan")._default_manager
        return self.exclude(models.Exists(plans.filter(pk=models.OuterRef("plan_fingerprint"))))

    def stopped_lacking_steps(self) -> RunStateQuerySet:
        """Runs stopped for staff because the deploy lacked steps of their plan (plans.STOPPED_MARK)."""
        from durableruns.plans import STOPPED_MARK

        return self.filter(status="needs_decision", reason__startswith=STOPPED_MARK)

    def stopped_unasked(self) -> RunStateQuerySet:
        """Runs stopped for staff with no escalation open on them (crash budget spent, a lookup that kept raising,
        steps the deploy lacks, data the database refused): the escalation queue does not list them. Read
        through run_state_stopped_idx."""
        escalations = self.model._meta.apps.get_model("durableruns", "Escalation")._default_manager
        return self.filter(status="needs_decision").exclude(
            models.Exists(escalations.filter(run_id=models.OuterRef("pk"), decision__isnull=True)))

    def waiting_for(self, step: str) -> RunStateQuerySet:
        """Runs waiting at the wait step `step` (its attempt begun, not over): a sleep, an event, an approval."""
        attempts = self.model._meta.apps.get_model("durableruns", "RunStep")._default_manager
        return self.filter(status__in=("waiting", "needs_decision")).filter(
            models.Exists(attempts.filter(run_id=models.OuterRef("pk"), step=step, status="started")))

    def workflow_names(self) -> list[str]:
        """The distinct workflows of the runs kept, in order: one index probe per workflow (a recursive walk of
        run_state_workflow_status_idx, each step the next name after the last), where SELECT DISTINCT would read
        an index entry per run. On a Citus cluster, which runs a recursive CTE only on one run's shard, a DISTINCT
        that every node answers for its own shards."""
        table = connections[self.db].ops.quote_name(self.model._meta.db_table)
        if is_distributed(self.db):
            names = self.model._default_manager.using(self.db).order_by().values_list("workflow", flat=True)
            return sorted(set(names.distinct()))
        with connections[self.db].cursor() as cursor:
            cursor.execute(
                f"WITH RECURSIVE names(workflow) AS (SELECT min(workflow) FROM {table} UNION ALL "
                f"SELECT (SELECT min(workflow) FROM {table} WHERE workflow > names.workflow) FROM names "
                "WHERE names.workflow IS NOT NULL) SELECT workflow FROM names WHERE workflow IS NOT NULL")
            return [row[0] for row in cursor.fetchall()]

    def having_effect_key_ids(self, key: str, limit: int = 1000) -> list[str]:
        """The ids of runs with an attempt under `key` (at most `limit`), read by run_step's effect key index."""
        attempts = self.model._meta.apps.get_model("durableruns", "RunStep")._default_manager
        return list(attempts.using(self.db).filter(effect_key=key).order_by().values_list("run_id", flat=True)
                    .distinct()[:limit])

    def having_effect_key(self, key: str) -> RunStateQuerySet:
        """Runs with an attempt under `key` (EXISTS, so a run with many such attempts is listed once)."""
        attempts = self.model._meta.apps.get_model("durableruns", "RunStep")._default_manager
        return self.filter(models.Exists(attempts.filter(run_id=models.OuterRef("pk"), effect_key=key)))


class RunPlanQuerySet(models.QuerySet):
    # Runs that may still move: what a deploy must keep the steps of until they drain.
    UNFINISHED = ("pending", "running", "waiting", "needs_decision")

    def with_active_runs(self) -> RunPlanQuerySet:
        """Plans annotated with `active_runs`: how many unfinished runs each still has."""
        runs = self.model._meta.apps.get_model("durableruns", "RunState")._default_manager
        if is_distributed(self.db):
            # On a Citus cluster the plans are a reference table, which may not correlate a subquery on the
            # distributed runs: one count per plan, grouped on every node, then written into the query.
            counts = (runs.using(self.db).filter(status__in=self.UNFINISHED).order_by()
                      .values_list("plan_fingerprint").annotate(n=models.Count("pk")))
            whens = [When(pk=fingerprint, then=models.Value(n)) for fingerprint, n in counts]
            return self.annotate(active_runs=Case(*whens, default=models.Value(0), output_field=models.IntegerField()))
        active = (runs.filter(plan_fingerprint=models.OuterRef("pk"), status__in=self.UNFINISHED)
                  .order_by().values("plan_fingerprint").annotate(n=models.Count("pk")).values("n"))
        return self.annotate(active_runs=Coalesce(models.Subquery(active), 0))

    def in_flight(self) -> RunPlanQuerySet:
        """Plans that still have unfinished runs."""
        return self.with_active_runs().filter(active_runs__gt=0)


class RunStepQuerySet(models.QuerySet):
    def visible_to(self, user: Any) -> RunStepQuerySet:
        """The attempts of the runs `user` may see (durableruns.scopes)."""
        hidden = scopes.hidden_workflows(user)
        return self.exclude(run__workflow__in=sorted(hidden)) if hidden else self

    def of_run(self, run_id: str) -> RunStepQuerySet:
        """Every attempt of a run, in the order they were made: one query for the boundary."""
        return self.filter(run_id=run_id).order_by("started_at", "step", "attempt")

    def open_approvals(self) -> RunStepQuerySet:
        """Approvals runs wait at that nobody has decided yet, oldest first: the approval queue (durableruns.waits
        records an approval's begun attempt with kind "approval"; a decision is an intervention on it)."""
        interventions = self.model._meta.apps.get_model("durableruns", "Intervention")._default_manager
        decided = interventions.filter(run_id=models.OuterRef("run_id"), step=models.OuterRef("step"),
                                       attempt=models.OuterRef("attempt"), action__in=("approve", "reject"))
        return (self.filter(status="started", progress__kind="approval",
                            run__status__in=("waiting", "needs_decision"))
                .exclude(models.Exists(decided)).order_by("started_at"))


class EscalationQuerySet(models.QuerySet):
    def visible_to(self, user: Any) -> EscalationQuerySet:
        """The escalations of the runs `user` may see (durableruns.scopes)."""
        hidden = scopes.hidden_workflows(user)
        return self.exclude(run__workflow__in=sorted(hidden)) if hidden else self

    def open(self) -> EscalationQuerySet:
        """Escalations nobody has decided yet, oldest first: the queue."""
        return self.filter(decision__isnull=True).order_by("opened_at")

    def decided(self) -> EscalationQuerySet:
        return self.filter(decision__isnull=False).order_by("-decision__decided_at")

    def for_attempt(self, run_id: str, step: str, attempt: int) -> EscalationQuerySet:
        return self.filter(run_id=run_id, step=step, attempt=attempt)


class InboxItemQuerySet(models.QuerySet):
    def visible_to(self, user: Any) -> InboxItemQuerySet:
        """The items of the runs `user` may see (durableruns.scopes)."""
        hidden = scopes.hidden_workflows(user)
        return self.exclude(run__workflow__in=sorted(hidden)) if hidden else self

    def open(self) -> InboxItemQuerySet:
        """Items still waiting for a person: not closed, their run not ended, and the approval's attempt still
        waiting or the escalation undecided (an approval timed out and went on, or a run cancelled, is no work)."""
        # The approval's attempt, joined through the run's own row (run_state to run_step on run_id, at most one
        # row: their primary key) rather than looked up by the item's copy of the run's id: the same on one node,
        # and on a Citus cluster the only way it runs (the items are a reference table, and Citus correlates a
        # distributed table only with another on their distribution column).
        waiting = models.FilteredRelation("run__attempts", condition=Q(
            run__attempts__step=F("step"), run__attempts__attempt=F("attempt"), run__attempts__status="started"))
        return (self.alias(_waiting=waiting)
                .filter(closed_at__isnull=True, run__status__in=RunPlanQuerySet.UNFINISHED)
                .filter(Q(kind="escalation", escalation__decision__isnull=True)
                        | Q(kind="approval", _waiting__status="started")))

    def stale(self) -> InboxItemQuerySet:
        """Items marked open that no decision will close, each by a fact the record shows: its run ended, its
        escalation was decided, or its approval's attempt is over (timed out and went on). Not merely "not
        open()": on a Citus cluster an item (a reference table) can be seen on one node before the attempt its
        commit began is seen on the run's shard, and an item whose attempt is not seen yet is not stale."""
        attempt = models.FilteredRelation("run__attempts", condition=Q(
            run__attempts__step=F("step"), run__attempts__attempt=F("attempt")))
        return (self.alias(_attempt=attempt)
                .filter(closed_at__isnull=True)
                .filter(~Q(run__status__in=RunPlanQuerySet.UNFINISHED)
                        | Q(kind="escalation", escalation__decision__isnull=False)
                        | Q(kind="approval", _attempt__status__in=("completed", "failed"))))

    def for_person(self, user: Any, *, kinds: tuple[str, ...], mine: bool) -> InboxItemQuerySet:
        """The open items of `kinds` (those the user may decide) of runs the user may see; with `mine`, those
        assigned to one of the user's groups or to nobody, and not held by someone else."""
        items = self.open().visible_to(user).filter(kind__in=kinds)
        if mine:
            groups = sorted(scopes.group_names(user))
            items = items.filter(Q(group="") | Q(group__in=groups)).filter(
                Q(claimed_by_user_id__isnull=True, claimed_by="") | Q(claimed_by_user_id=user.pk))
        return items

    def in_inbox_order(self) -> InboxItemQuerySet:
        """The overdue first, then by due time (which is the same order: an overdue item's due time is the
        earliest), those due never last, then the oldest first; `due_key` is what a cursor pages on."""
        never = models.Value(datetime(9999, 12, 31, tzinfo=UTC), output_field=models.DateTimeField())
        return self.annotate(due_key=Coalesce("due_at", never)).order_by("due_key", "opened_at", "id")
