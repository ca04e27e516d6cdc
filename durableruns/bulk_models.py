"""The record of a bulk act (issue 32): one act (cancel, retry, restart, or an escalation's decision) asked once for
every run a filter matched, and its items, the runs frozen at that moment, each acted on by a worker later.

Imported by durableruns.models, so the app's models module holds these too; it names the other models by their
labels only, so the two modules are no circle.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class BulkItemState(models.TextChoices):
    PENDING = "pending", "to act on"
    DONE = "done", "acted on"
    SKIPPED = "skipped", "skipped: no longer fits"


class BulkItemQuerySet(models.QuerySet):
    def pending(self) -> BulkItemQuerySet:
        """Items no worker has acted on or skipped yet, oldest first: what a worker takes next."""
        return self.filter(state=BulkItemState.PENDING).order_by("pk")

    def skipped(self) -> BulkItemQuerySet:
        """Items skipped with a reason (the run no longer fitted, or the act was refused), in the order taken."""
        return self.filter(state=BulkItemState.SKIPPED).order_by("pk")


class Bulk(models.Model):
    """One bulk act: who asked for what, on which filter, and why; its items are the runs it froze."""

    class Action(models.TextChoices):
        CANCEL = "cancel", "cancel"
        RETRY = "retry", "retry"
        RESTART = "restart", "restart from a step"
        DECIDE = "decide", "decide escalations"

    bulk_id = models.CharField(max_length=40, primary_key=True)
    action = models.CharField(max_length=20, choices=Action.choices)
    filter = models.JSONField(
        default=dict, blank=True, help_text="The runs' filter, as GET /api/runs/ takes it (checked again per run)."
    )
    from_step = models.CharField(max_length=200, blank=True, default="")
    outcome = models.CharField(max_length=20, blank=True, default="", help_text="A decision bulk's outcome.")
    note = models.TextField()
    decided_by = models.CharField(max_length=200)
    # As Intervention.user: by id, no constraint (the runs may live in a database of their own).
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    created_at = models.DateTimeField()
    total = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "run_bulk"
        verbose_name = "bulk act"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.action} bulk {self.bulk_id}"


class BulkItem(models.Model):
    """One run (for a decision bulk: one escalation) of a bulk, acted on once: its state moves from pending to
    done or skipped in the very commit that acts on the run."""

    id = models.BigAutoField(primary_key=True)
    bulk = models.ForeignKey(Bulk, on_delete=models.CASCADE, related_name="items", db_index=False)
    run_id = models.CharField(max_length=200)
    escalation_id = models.BigIntegerField(null=True, blank=True)
    state = models.CharField(max_length=10, choices=BulkItemState.choices, default=BulkItemState.PENDING)
    reason = models.TextField(blank=True, default="")
    acted_at = models.DateTimeField(null=True, blank=True)

    objects = BulkItemQuerySet.as_manager()

    class Meta:
        db_table = "run_bulk_item"
        verbose_name = "bulk act item"
        indexes = [
            models.Index(fields=["bulk", "state"], name="run_bulk_item_state_idx"),  # a bulk's progress
            # what workers take next, whichever bulk: only the pending items are in it
            models.Index(fields=["id"], condition=models.Q(state="pending"), name="run_bulk_item_pending_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.bulk_id}:{self.run_id} ({self.state})"
