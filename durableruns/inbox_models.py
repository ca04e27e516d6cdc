"""An approval or an escalation as work for people (durableruns.inbox): the record of who it is assigned to, when it
is due, who holds it.

Imported by durableruns.models, so the app's models module holds these too; it names the other models by their
labels only, so the two modules are no circle.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from durableruns.querysets import InboxItemQuerySet


class InboxItem(models.Model):
    """An approval or an escalation as work for people (durableruns.inbox): its group (asked once, as it opens;
    empty: everyone with the permission), when it is due and moves to `escalate_to`, who holds it. Opened by the
    store in the commit that begins the approval's wait or opens the escalation; closed by the decision's."""

    class Kind(models.TextChoices):
        APPROVAL = "approval", "approval"
        ESCALATION = "escalation", "escalation"

    run = models.ForeignKey("durableruns.RunState", on_delete=models.CASCADE, related_name="inbox_items")
    step = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField()
    kind = models.CharField(max_length=10, choices=Kind.choices)
    escalation = models.OneToOneField(
        "durableruns.Escalation", null=True, blank=True, on_delete=models.CASCADE, related_name="inbox_item"
    )
    group = models.CharField(max_length=150, blank=True, default="")
    escalate_to = models.CharField(max_length=150, blank=True, default="")
    opened_at = models.DateTimeField()
    due_at = models.DateTimeField(null=True, blank=True)
    escalate_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=200, blank=True, default="")
    claimed_by_user_id = models.IntegerField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    reminded_at = models.DateTimeField(null=True, blank=True)
    moved_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    objects = InboxItemQuerySet.as_manager()

    class Meta:
        db_table = "run_inbox_item"
        ordering = ["due_at", "opened_at", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "step", "attempt"], name="run_inbox_item_once")]
        indexes = [models.Index(fields=["due_at"], name="run_inbox_item_due_idx", condition=Q(closed_at__isnull=True))]

    def __str__(self) -> str:
        return f"{self.kind} {self.run_id}/{self.step}#{self.attempt}"


class Inbox(InboxItem):  # the admin's /admin/durableruns/inbox/: the open items for the person signed in
    class Meta:
        proxy = True
        verbose_name = verbose_name_plural = "inbox"
