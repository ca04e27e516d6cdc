"""Alerts: an escalation left open too long is e-mailed (Django's mail) to the staff who may decide it.

Who may decide is who holds durableruns.decide_escalation (by their own permissions, a group's, or as a
superuser), is active, and has an e-mail address; nobody else is ever written to. Each open escalation is mailed
once it has been open for DURABLERUNS_ESCALATION_ALERT_SECONDS, and again at most once per that period while it
stays open: Escalation.alerted_at records the last mail. The mark is taken by a conditional update before the mail
goes, so two overlapping cron jobs do not both send it; a mail that fails to send gives the mark back.

Triggered by `runs_health --alert`, so the cron line that watches health also sends the alerts.
"""

from __future__ import annotations

import logging
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime

from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from durableruns import conf, services, store
from durableruns.clock import Clock
from durableruns.models import Escalation
from durableruns.ops.health import age_text

log = logging.getLogger("durableruns")

PERMISSION = "durableruns.decide_escalation"


@dataclass(kw_only=True)
class AlertReport:
    sent: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)  # escalation id, recipients
    failed: list[tuple[int, str]] = field(default_factory=list)
    due: int = 0  # escalations open past the period and not mailed within it
    recipients: tuple[str, ...] = ()

    def summary(self) -> str:
        if not self.due:
            return "alerts: no escalation to mail about"
        if not self.recipients:
            return (
                f"alerts: {self.due} escalation(s) open too long, but no active user with an e-mail address may "
                f"decide them ({PERMISSION}); nothing sent"
            )
        failed = f", {len(self.failed)} failed to send" if self.failed else ""
        return f"alerts: mailed {len(self.sent)} escalation(s) to {len(self.recipients)} person(s){failed}"


def deciders() -> tuple[str, ...]:
    """The e-mail addresses of the active users who may decide escalations, sorted."""
    user_model = get_user_model()
    email_field = user_model.get_email_field_name()
    users = user_model._default_manager.exclude(**{email_field: ""}).exclude(**{f"{email_field}__isnull": True})
    if hasattr(user_model, "is_active"):
        users = users.filter(is_active=True)
    names = {f.name for f in user_model._meta.get_fields()}
    if {"is_superuser", "user_permissions", "groups"} <= names:  # PermissionsMixin: narrow it down in SQL first
        held = {"codename": "decide_escalation", "content_type__app_label": "durableruns"}
        users = users.filter(
            Q(is_superuser=True)
            | Q(**{f"user_permissions__{k}": v for k, v in held.items()})
            | Q(**{f"groups__permissions__{k}": v for k, v in held.items()})
        ).distinct()
    # Then ask the authentication backends, as the admin does when the person opens the page.
    return tuple(sorted({getattr(u, email_field) for u in users if u.has_perm(PERMISSION)}))


def decision_url(escalation_id: int) -> str:
    return conf.admin_base_url() + reverse("admin:durableruns_escalation_change", args=[escalation_id])


def spelled(text: str) -> str:
    """`text` with each control character (a newline, an escape, ...) or line separator written as its escape
    (\\n, \\x1b): what the record holds may predate start()'s refusal of them, and a newline in a header would fail
    every mail about that run, for ever."""
    return "".join(repr(ch)[1:-1] if unicodedata.category(ch) in ("Cc", "Zl", "Zp") else ch for ch in text)


def message(escalation: Escalation, *, now: datetime, recipients: tuple[str, ...]) -> EmailMessage:
    """The mail about one open escalation: where its run stands, why it stopped, how to check, where to decide."""
    run = escalation.run
    sentence = services.boundary_of(run).sentence(timezone.get_current_timezone())
    run_id = spelled(run.run_id)
    waited = age_text(now - escalation.opened_at)
    doc = " ".join(services.step_doc(run, escalation.step).split())
    body = "\n".join(
        [
            f"Run {run_id} ({run.workflow}) has waited {waited} for a decision on its step {escalation.step}.",
            "",
            f"Where it stands: {sentence}.",
            f"Why it stopped: {escalation.reason or 'the step is in doubt and only a person can settle it'}",
            f"Effect key: {escalation.effect_key or '-'}",
            f"How to check the far system: {doc or 'the step has no docstring to say how.'}",
            "",
            f"Decide it here: {decision_url(escalation.pk)}",
            "",
            f"You receive this because you may decide escalations ({PERMISSION}). It is sent again at most once every "
            f"{age_text(conf.escalation_alert_period())} while the escalation stays open.",
        ]
    )
    subject = f"[durableruns] {run_id}: {spelled(escalation.step)} waits for a decision ({waited})"
    return EmailMessage(subject=subject, body=body, to=list(recipients))


def send_escalation_alerts(*, clock: Clock | None = None) -> AlertReport:
    """Mail each escalation open longer than the period and not mailed within it to the staff who may decide
    it; one mail per escalation."""
    period = conf.escalation_alert_period()
    now = (clock or Clock()).now()
    stale = now - period
    due = list(
        Escalation.objects.open()
        .filter(opened_at__lte=stale)
        .filter(Q(alerted_at__isnull=True) | Q(alerted_at__lte=stale))
        .select_related("run")
        .prefetch_related("run__attempts")
    )
    report = AlertReport(due=len(due))
    if not due:
        return report
    report.recipients = deciders()
    if not report.recipients:
        log.warning("%s escalation(s) open too long and nobody with an e-mail address may decide them", len(due))
        return report
    for escalation in due:
        previous = escalation.alerted_at
        # Take the mark first, conditional on what was read: of two overlapping passes one sends.
        if not store.take_alert_mark(escalation.pk, previous=previous, now=now):
            continue
        try:
            message(escalation, now=now, recipients=report.recipients).send(fail_silently=False)
        except Exception as exc:  # an SMTP outage: give the mark back so the next pass tries again
            store.give_alert_mark_back(escalation.pk, now=now, previous=previous)
            report.failed.append((escalation.pk, f"{type(exc).__name__}: {exc}"))
            log.error("escalation %s: the alert mail was not sent: %s", escalation.pk, exc)
            continue
        report.sent.append((escalation.pk, report.recipients))
    return report
