"""The record: run_state (one small row per run) and run_step (one row per attempt), plus escalations and
the decisions staff take on them. No I/O and no business rules here; only durableruns.store writes these tables.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from durableruns.boundary import StepAttempt
from durableruns.limits import PARKED
from durableruns.plans import Plan
from durableruns.querysets import EscalationQuerySet, RunPlanQuerySet, RunStateQuerySet, RunStepQuerySet


class RunStatus(models.TextChoices):
    PENDING = "pending", "pending"
    RUNNING = "running", "running"
    WAITING = "waiting", "waiting"
    NEEDS_DECISION = "needs_decision", "needs decision"
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


class StepStatus(models.TextChoices):
    STARTED = "started", "started"
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"


class Resolution(models.TextChoices):
    """How a completed attempt came to be completed."""

    RETURNED = "returned", "the step returned"
    LOOKUP = "lookup", "resolved by lookup"
    DECISION = "decision", "decided by staff"
    SKIPPED = "skipped", "skipped: its when= said no"
    EVENT = "event", "an event sent to the run"
    TIMER = "timer", "its wake time came"
    TIMEOUT = "timeout", "timed out, and went on"
    CHILDREN = "children", "its child runs ended"
    COPIED = "copied", "copied from the run it restarts"


# The runs a debounced start may still replace: started with a key, not begun, not ended (store.debounce).
DEBOUNCING = Q(debounce_key__isnull=False, status__in=["pending", "waiting"])


class RunState(models.Model):
    """Where a run is and who owns it. Rewritten on every commit a worker makes, so kept small."""

    run_id = models.CharField(max_length=200, primary_key=True)
    workflow = models.CharField(max_length=200)
    plan_fingerprint = models.CharField(max_length=64)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.PENDING)
    cursor = models.PositiveIntegerField(default=0, help_text="Index in the plan of the next step to run.")
    owner = models.CharField(max_length=200, blank=True, default="")
    epoch = models.PositiveBigIntegerField(default=0, help_text="Bumped on every claim; fences stale workers.")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    wake_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True, default="", help_text="Why the run waits, stopped or failed.")
    ending = models.CharField(
        max_length=20, blank=True, default="", db_default="",
        help_text="Set while a run that ends unfinished gives back what it holds: the status it reaches once "
                  "its releases are done (cancelled or failed; needs_decision for a run stopped for a step its "
                  "deploy lacks). Empty otherwise.")
    input = models.JSONField(default=dict)
    trace_context = models.JSONField(
        null=True, blank=True,
        help_text="The trace context current when the run was started (OpenTelemetry's propagators' fields: "
                  "traceparent, tracestate), so each pass over the run continues that trace. Recorded only with "
                  "the [otel] extra installed and a span active; NULL otherwise.")
    priority = models.IntegerField(
        default=0, db_default=0,
        help_text="Among due runs, a higher priority is claimed first (then the oldest first).")
    queue = models.CharField(
        max_length=100, default="default", db_default="default",
        help_text="The queue the run is on: a worker started with resume_runs --queue takes only its queues' runs.")
    concurrency_key = models.CharField(
        max_length=200, null=True, blank=True,
        help_text="The key the run counts under for its workflow's concurrency limit, recorded at start: empty for "
                  "a limit on the whole workflow, NULL when its workflow had no limit then.")
    parent_id = models.CharField(
        max_length=200, null=True, blank=True,
        help_text="The run that started this one as a child (ctx.start_run), recorded in the commit that created "
                  "it; NULL for a run started otherwise. A join of the parent waits until its children end.")
    debounce_key = models.CharField(
        max_length=200, null=True, blank=True,
        help_text="The key of a debounced start (start(debounce=, key=)) while the run has not begun: a start with "
                  "the same key replaces its input and moves its start. Cleared by the claim that begins it.")
    restarted_from = models.CharField(
        max_length=200, null=True, blank=True,
        help_text="The run this one restarts (durableruns.restart), recorded with it; NULL for a run started "
                  "otherwise.")
    restarted_step = models.CharField(
        max_length=200, null=True, blank=True,
        help_text="The step a restarted run was restarted from: the steps before it were copied from the source.")
    key_run_id = models.CharField(
        max_length=200, null=True, blank=True,
        help_text="The run whose effect keys this one's steps keep (a restart's original, through every restart of "
                  "a restart); NULL: its own run_id.")
    deadline_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When the run must have ended, by the database's clock, counted from its start (Workflow("
                  "deadline=) or start(deadline=)); past it a worker ends the run (durableruns.deadlines). NULL: none.")
    on_deadline = models.CharField(
        max_length=10, null=True, blank=True,
        help_text="What the run ends as once its deadline passes, recorded at start with it: cancel or fail.")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    # Both nullable, with no default, so that adding them never rebuilds the table on SQLite (which would drop the
    # triggers earlier migrations put on it).
    takeovers = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="How many claims in a row took the run over from a worker whose lease ran out, with its cursor "
                  "where the first of them found it: a worker that dies at a step recording nothing (intent=False) "
                  "leaves no attempt to count against the crash budget, and this counts instead. 0 once a claim "
                  "takes it otherwise (a worker handed it back, set it to wait, or staff retried it); NULL until "
                  "a claim first takes it.")
    takeover_cursor = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="The cursor the run had when a claim last took it: a takeover at another cursor counts from 1.")
    alerted_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When the staff who may retry it were last e-mailed about it while it stood stopped for staff "
                  "with no escalation (runs_health --alert), by the database's clock.")

    objects = RunStateQuerySet.as_manager()

    class Meta:
        db_table = "run_state"
        verbose_name = "run"
        ordering = ["-created_at"]
        permissions = [
            ("start_run", "Can start runs"),
            ("cancel_run", "Can cancel runs"),
            ("retry_run", "Can retry failed runs"),
            ("adopt_plan", "Can move runs to the current plan"),
            ("restart_run", "Can restart runs from a step"),
        ]
        indexes = [
            # Only runs a worker may still take are indexed, so claiming stays flat however many runs finished;
            # in the claim's own order (higher priority first, then the oldest), so a claim walks it and stops at
            # the first unlocked due run.
            models.Index(
                fields=["-priority", "created_at"],
                name="run_state_active_idx",
                condition=Q(status__in=["pending", "running", "waiting"]),
            ),
            models.Index(fields=["workflow", "status"], name="run_state_workflow_status_idx"),
            # Runs stopped for staff, which run_state_active_idx leaves out: the health checks, metrics and
            # dashboard find them (and their attempts in doubt) without reading every finished run. Status is
            # already indexed, so this adds no cost to a step's write.
            models.Index(fields=["workflow"], name="run_state_stopped_idx", condition=Q(status="needs_decision")),
            models.Index(fields=["-created_at"], name="run_state_created_idx"),
            # The claim's two probes (store.claims): the pending (or abandoned) run of highest priority, the oldest
            # among equals, and the waiting runs whose wake time has come, so that any number of runs asleep costs a
            # claim nothing (issue 22).
            models.Index(fields=["-priority", "created_at"], name="run_state_ready_idx",
                         condition=Q(status__in=["pending", "running"])),
            # Woken runs in wake order, those woken at the same moment in the order they were recorded.
            models.Index(fields=["wake_at", "created_at"], name="run_state_wake_idx", condition=Q(status="waiting")),
            # Unfinished runs by plan: the admin's plan filter counts them per plan, and reading them through
            # this index costs the few unfinished runs, not every run kept (a scan of run_state at a million).
            # Unfinished runs with a deadline, in deadline order: the sweep (durableruns.deadlines) reads the few
            # past it without walking the runs that have none.
            models.Index(fields=["deadline_at"], name="run_state_deadline_idx",
                         condition=Q(deadline_at__isnull=False,
                                     status__in=["pending", "running", "waiting", "needs_decision"])),
            # The runs a deadline ended that nobody was mailed about yet (ops.alerts): a mail marks them, and they
            # leave it, so it stays as small as the runs not yet mailed.
            models.Index(fields=["deadline_at"], name="run_state_deadline_mail_idx",
                         condition=Q(status__in=["cancelled", "failed"], alerted_at__isnull=True,
                                     reason__startswith="deadline of ")),
            models.Index(fields=["plan_fingerprint"], name="run_state_unfinished_plan_idx",
                         condition=Q(status__in=["pending", "running", "waiting", "needs_decision"])),
            # Concurrency limits (store.claims, _CLAIM_TEMPLATE): the runs holding a slot of a limit, which a
            # claim counts per (workflow, key) under the key's lock, and the runs parked by a limit in the order
            # they are let go when a slot frees. Both hold limited runs only, so they stay small.
            models.Index(fields=["workflow", "concurrency_key"], name="run_state_limit_running_idx",
                         condition=Q(status="running", concurrency_key__isnull=False)),
            models.Index(fields=["workflow", "concurrency_key", "-priority", "created_at"],
                         name="run_state_limit_parked_idx",
                         condition=Q(status="waiting", concurrency_key__isnull=False, reason=PARKED)),
            # The limited runs ended by someone else while their worker may still be inside a call: each keeps
            # the lease it had, and its slot with it, until that worker lets go or the lease runs out (few).
            models.Index(fields=["workflow", "concurrency_key"], name="run_state_limit_held_idx",
                         condition=Q(concurrency_key__isnull=False, lease_expires_at__isnull=False)
                         & ~Q(status="running")),
            # A run's children (a join reads their statuses, a cancel finds them, a child's end its siblings): only
            # children are indexed, so runs started otherwise cost the index nothing.
            models.Index(fields=["parent_id"], name="run_state_parent_idx", condition=Q(parent_id__isnull=False)),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=RunStatus.values), name="run_state_status_valid"),
            # One run not yet begun per debounce key and workflow: concurrent debounced starts with one key meet
            # here, and all but one replace that run's input instead (store.debounce). A run that begins leaves it
            # (the claim clears its key); so does one ended before it began (a staff cancel).
            models.UniqueConstraint(fields=["workflow", "debounce_key"], name="run_state_debounce_key_uniq",
                                    condition=DEBOUNCING),
        ]

    def __str__(self) -> str:
        return self.run_id


class RunCount(models.Model):
    """Finished runs counted per workflow and status, so that a scrape reads a few rows instead of every run kept.

    Kept by the database, not by durableruns.store: on PostgreSQL by triggers on run_state (a run entering or leaving
    completed, failed or cancelled, inserted finished, deleted, truncated), in the same commit as the run's own
    change, so every path that moves a run (the engine, a staff act, prune, a raw UPDATE) counts without code of
    its own; on SQLite by triggers that count finishes only (`finished`). Unfinished runs are not counted here:
    they are few, and counted exactly through their partial indexes. Created and seeded by
    the migration named run_count.

    Each (workflow, status) is split into shards (pg_backend_pid() % 64, migration 0029), so two workers finishing
    runs of one workflow at once rarely wait on one row; a reader sums the shards. A shard's `present` may be negative
    (a run counted in by one connection and deleted by another); the sum is exact."""

    pk = models.CompositePrimaryKey("workflow", "status", "shard")
    workflow = models.CharField(max_length=200)
    status = models.CharField(max_length=20, choices=RunStatus.choices)
    shard = models.SmallIntegerField()
    present = models.BigIntegerField(
        default=0, help_text="Runs of this workflow in this status in run_state now, in this shard (PostgreSQL; 0 on "
                             "SQLite, whose gauge counts run_state itself). Goes down when a run is pruned, deleted "
                             "or retried.")
    finished = models.BigIntegerField(
        default=0, help_text="Times a run of this workflow entered this status, in this shard, since the migration "
                             "that made this table (which counted the runs then present). Never goes down: a prune "
                             "removes rows, not what happened.")

    class Meta:
        db_table = "run_count"
        verbose_name = "run count"

    def __str__(self) -> str:
        return f"{self.workflow}/{self.status}#{self.shard}"


class RunWaiter(models.Model):
    """A caller of durableruns.result() waiting for a run to end (PostgreSQL; migration 0029): the trigger
    run_state_ended notifies durableruns_ended only for a run that has one, since a NOTIFY serializes every
    notifying commit (PostgreSQL holds one lock across each such commit, WAL flush included). The waiter deletes
    its row when it stops waiting; one a killed caller left only makes that run's end notify."""

    id = models.BigAutoField(primary_key=True)
    run_id = models.CharField(max_length=200, db_index=True)

    class Meta:
        db_table = "run_waiter"
        verbose_name = "run waiter"

    def __str__(self) -> str:
        return f"waiting for {self.run_id}"


class RunPlan(models.Model):
    """A plan runs started under: its steps (name and policy, in order), recorded once per fingerprint.

    Written the first time a process starts a run of that fingerprint (never changed after), so a run is read
    through its own plan whatever code the reader runs. `workflow` is the workflow it was first recorded for.
    """

    fingerprint = models.CharField(max_length=64, primary_key=True)
    workflow = models.CharField(max_length=200)
    steps = models.JSONField(help_text="[[step, policy], ...] in plan order.")
    first_seen = models.DateTimeField()

    objects = RunPlanQuerySet.as_manager()

    class Meta:
        db_table = "run_plan"
        verbose_name = "plan"
        ordering = ["-first_seen"]

    def __str__(self) -> str:
        return f"{self.workflow} {self.fingerprint}"

    def to_plan(self) -> Plan:
        """Convert to the pure core's frozen value."""
        return Plan(fingerprint=self.fingerprint, workflow=self.workflow,
                    steps=tuple((str(name), str(policy)) for name, policy in self.steps))


class RunStep(models.Model):
    """One attempt at one step. Appended, never overwritten; its status moves forward once from started."""

    pk = models.CompositePrimaryKey("run_id", "step", "attempt")
    # No index of its own: the primary key (run_id, step, attempt) already serves lookups by run, and every
    # step inserts a row, so each needless index is paid on every step.
    run = models.ForeignKey(RunState, on_delete=models.CASCADE, db_column="run_id", related_name="attempts",
                            db_index=False)
    step = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=20, choices=StepStatus.choices)
    effect_key = models.CharField(max_length=500, blank=True, default="")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    renewed_at = models.DateTimeField(
        null=True, blank=True,
        help_text="The last lease renewal while this attempt was in hand (the database's clock): the last moment "
                  "its process was known alive.")
    held_until = models.DateTimeField(
        null=True, blank=True,
        help_text="The lease expiry its worker last held while this attempt was in hand (the database's clock): "
                  "the last moment a lost worker could still have made its call.")
    raised_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When the step raised in its live worker and was left in doubt (the database's clock): its call "
                  "was over by then, so this bounds it instead of the lease.")
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    resolution = models.CharField(max_length=20, choices=Resolution.choices, blank=True, default="")
    owner = models.CharField(max_length=200, blank=True, default="")
    epoch = models.PositiveBigIntegerField(default=0)
    loop_cursor = models.PositiveIntegerField(default=0, help_text="Items of the step's loop checkpointed.")
    progress = models.JSONField(default=dict, blank=True)
    # What the step last said with ctx.progress (durableruns.progress), the latest only, on the database's clock.
    progress_message = models.TextField(null=True, blank=True)
    progress_done = models.PositiveBigIntegerField(null=True, blank=True)
    progress_total = models.PositiveBigIntegerField(null=True, blank=True)
    progress_at = models.DateTimeField(null=True, blank=True)
    error_detail = models.TextField(
        blank=True, default="", db_default="",
        help_text="The last frames of the traceback of what the step raised (bounded), recorded with the error.")

    objects = RunStepQuerySet.as_manager()

    class Meta:
        db_table = "run_step"
        verbose_name = "attempt"
        constraints = [
            models.CheckConstraint(condition=Q(status__in=StepStatus.values), name="run_step_status_valid"),
        ]
        indexes = [models.Index(fields=["effect_key"], name="run_step_effect_key_idx")]

    def __str__(self) -> str:
        return f"{self.run_id}/{self.step}#{self.attempt}"

    def to_attempt(self) -> StepAttempt:
        """Convert to the pure core's frozen value."""
        return StepAttempt(
            step=self.step,
            attempt=self.attempt,
            status=self.status,
            effect_key=self.effect_key,
            started_at=self.started_at,
            finished_at=self.finished_at,
            renewed_at=self.renewed_at,
            held_until=self.held_until,
            raised_at=self.raised_at,
            loop_cursor=self.loop_cursor,
            progress=self.progress or {},
            result=self.result,
            error=self.error,
        )


class RunAttribute(models.Model):
    """One attribute of a run (durableruns.attributes): its name and value, the value as text beside its kind."""

    pk = models.CompositePrimaryKey("run_id", "name")
    run = models.ForeignKey(RunState, on_delete=models.CASCADE, db_column="run_id", related_name="attributes",
                            db_index=False)  # the primary key (run_id, name) serves lookups by run
    name = models.CharField(max_length=50)
    value_text = models.CharField(max_length=200)
    kind = models.CharField(max_length=1, default="s", help_text="s: a string; i: an integer (its decimal text)")

    class Meta:
        db_table = "run_attribute"
        verbose_name = "run attribute"
        indexes = [
            models.Index(fields=["name", "value_text"], name="run_attribute_name_value_idx"),  # ?attr=name:value
            models.Index(fields=["value_text"], name="run_attribute_value_idx"),  # the admin's any-name search
        ]

    def __str__(self) -> str:
        return f"{self.run_id}:{self.name}={self.value_text}"


class Escalation(models.Model):
    """An in-doubt step that no machine can settle, opened by the engine for a person to decide."""

    run = models.ForeignKey(RunState, on_delete=models.CASCADE, related_name="escalations")
    step = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField()
    effect_key = models.CharField(max_length=500, blank=True, default="")
    in_doubt_since = models.DateTimeField()
    opened_at = models.DateTimeField()
    reason = models.TextField(blank=True, default="")
    alerted_at = models.DateTimeField(
        null=True, blank=True,
        help_text="When the staff who may decide it were last e-mailed about it (runs_health --alert), by the "
                  "database's clock: an open escalation is mailed at most once per "
                  "DURABLERUNS_ESCALATION_ALERT_SECONDS.")

    objects = EscalationQuerySet.as_manager()

    class Meta:
        db_table = "run_escalation"
        verbose_name_plural = "escalation queue"
        ordering = ["opened_at"]
        permissions = [("decide_escalation", "Can decide escalated steps")]
        constraints = [
            models.UniqueConstraint(fields=["run", "step", "attempt"], name="run_escalation_once_per_attempt"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}/{self.step}#{self.attempt}"

    @property
    def is_open(self) -> bool:
        return not hasattr(self, "decision")


class Intervention(models.Model):
    """A staff act on a run: who, when, why. A decision on an escalation is one, made at most once."""

    class Action(models.TextChoices):
        HAPPENED = "happened", "it happened"
        DID_NOT_HAPPEN = "did_not_happen", "it did not happen, run it again"
        ABANDON = "abandon", "abandon the run"
        CANCEL = "cancel", "cancel the run"
        RETRY = "retry", "retry the failed step"
        ADOPT_PLAN = "adopt_plan", "move the run to the current plan"
        APPROVE = "approve", "approve"
        REJECT = "reject", "reject"
        RESTART = "restart", "restart the run from a step"
        TAKE = "take", "take an inbox item"
        RELEASE = "release", "release an inbox item"
        REASSIGN = "reassign", "move an overdue inbox item to another group"
        OVERRIDE = "override", "decide an item another person holds"

    run = models.ForeignKey(RunState, on_delete=models.CASCADE, related_name="interventions")
    escalation = models.OneToOneField(
        Escalation, null=True, blank=True, on_delete=models.CASCADE, related_name="decision"
    )
    step = models.CharField(max_length=200, blank=True, default="")
    attempt = models.PositiveIntegerField(null=True, blank=True)
    action = models.CharField(max_length=20, choices=Action.choices)
    decided_by = models.CharField(max_length=200)
    # Who decided, by id, with no constraint and nothing done on the user's deletion: the runs may live in a
    # database of their own (DURABLERUNS_DATABASE) while the users live in the site's, and a staff act is
    # evidence, never edited afterwards (decided_by keeps the name).
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.DO_NOTHING,
                             db_constraint=False)
    decided_at = models.DateTimeField()
    note = models.TextField()
    result = models.JSONField(null=True, blank=True)
    bulk_id = models.CharField(max_length=40, null=True, blank=True, help_text="The bulk act that made it, if one did.")

    class Meta:
        db_table = "run_intervention"
        ordering = ["-decided_at"]
        permissions = [("decide_approval", "Can approve or reject runs' approvals")]
        constraints = [
            # An approval's attempt is decided once: a second decision fails here, however concurrent.
            models.UniqueConstraint(fields=["run", "step", "attempt"], name="run_intervention_one_approval",
                                    condition=Q(action__in=["approve", "reject"])),
        ]

    def __str__(self) -> str:
        return f"{self.get_action_display()} by {self.decided_by}"


class RunEvent(models.Model):
    """An event sent to a run from outside (durableruns.send): kept until a wait for its name consumes it, the
    oldest first, one per wait; the consuming attempt is recorded in the commit that completes the wait."""

    run = models.ForeignKey(RunState, on_delete=models.CASCADE, related_name="events", db_index=False)
    event = models.CharField(max_length=200)
    key = models.CharField(max_length=500, null=True, blank=True,
                           help_text="The sender's idempotency key: a second event with it is not recorded.")
    payload = models.JSONField(default=dict)
    sent_at = models.DateTimeField()
    consumed_step = models.CharField(max_length=200, blank=True, default="")
    consumed_attempt = models.PositiveIntegerField(null=True, blank=True)
    consumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "run_event"
        verbose_name = "event"
        ordering = ["sent_at", "id"]
        permissions = [("send_event", "Can send events to runs")]
        indexes = [models.Index(fields=["run", "event", "sent_at"], name="run_event_run_idx")]
        constraints = [
            models.UniqueConstraint(fields=["run", "key"], name="run_event_key_once", condition=Q(key__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}/{self.event}#{self.pk}"

    @property
    def consumed(self) -> bool:
        return self.consumed_at is not None


class WorkerPresence(models.Model):
    """A resume_runs process as it last reported itself: what a health check reads to tell whether workers run,
    how they pick work up (listening, or polling because the listener was lost), and how far their clocks are
    from the database's. Written by the worker (store.report_presence) every few seconds; times are the
    database's."""

    name = models.CharField(max_length=200, primary_key=True, help_text="The owner it claims under: host:pid.")
    threads = models.PositiveIntegerField(default=1)
    pickup = models.CharField(max_length=500, blank=True, default="",
                              help_text="How idle threads are woken: listening, or polling (and why).")
    skew_seconds = models.FloatField(
        null=True, blank=True, help_text="How far its host's clock was ahead of the database's (negative: behind).")
    runs_in_hand = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField()
    seen_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "run_worker"
        verbose_name = "worker"
        ordering = ["-seen_at"]

    def __str__(self) -> str:
        return self.name

    @property
    def listening(self) -> bool:
        return self.pickup.startswith("listening")


class ScheduleState(models.Model):
    """A declared schedule (durableruns.schedules) as the record knows it: when a worker first saw it, and the
    latest slot whose run was started, recorded in the commit that started it. Slots before `created_at` are
    never started; each later slot's run has the run_id `<name>@<slot>`, which the primary key allows once."""

    name = models.CharField(max_length=150, primary_key=True)
    last_slot = models.DateTimeField(null=True, blank=True, help_text="The latest slot whose run was started.")
    created_at = models.DateTimeField(help_text="When a worker first saw the schedule: its slots count from then.")
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "run_schedule"
        verbose_name = "schedule"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class RateTurn(models.Model):
    """One entry of a step's rate-limit log (durableruns.rates): per (step, key), each start of an attempt at the
    database's time it was taken (`started`), and each turn given to a run waiting for one (a reservation, which
    becomes its start). Entries older than the step's window are deleted as turns are taken."""

    step = models.CharField(max_length=200)
    key = models.CharField(max_length=200, blank=True, default="")
    at = models.DateTimeField(help_text="The start, or the moment a waiting run's turn comes.")
    run_id = models.CharField(max_length=200)
    started = models.BooleanField(default=False)

    class Meta:
        db_table = "run_rate_turn"
        verbose_name = "rate-limit turn"
        ordering = ["step", "key", "at"]
        indexes = [
            models.Index(fields=["step", "key", "at"], name="run_rate_turn_bucket_idx"),
            models.Index(fields=["run_id", "step"], name="run_rate_turn_run_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.step}[{self.key}]@{self.at:%H:%M:%S.%f}"


class ApprovalQueue(RunState):  # the approval queue's entry in the admin's sidebar and app index
    class Meta:
        proxy = True
        verbose_name = verbose_name_plural = "approval queue"


# The inbox's items and a bulk act's record live in modules of their own; imported here, they are models of the app.
from durableruns.bulk_models import Bulk as Bulk  # noqa: E402
from durableruns.bulk_models import BulkItem as BulkItem  # noqa: E402
from durableruns.bulk_models import BulkItemState as BulkItemState  # noqa: E402
from durableruns.inbox_models import Inbox as Inbox  # noqa: E402
from durableruns.inbox_models import InboxItem as InboxItem  # noqa: E402
