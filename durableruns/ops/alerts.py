"""Alerts: what waits on staff too long is e-mailed (Django's mail) to the staff who may act on it.

An escalation left open goes to those who may decide it (durableruns.decide_escalation); a run stopped for staff
with no escalation (its crash budget spent, a lookup that kept raising, steps the deploy lacks, data the database
refused) goes to those who may retry it (durableruns.retry_run), with its reason; so does, once, a run its
deadline ended (durableruns.deadlines), saying so. Who may is who holds the
permission (by their own permissions, a group's, or as a superuser), is active, and has an e-mail address; nobody
else is ever written to. Each is mailed once it has waited DURABLERUNS_ESCALATION_ALERT_SECONDS, and again at
most once per that period while it waits: Escalation.alerted_at and RunState.alerted_at record the last mail. The
mark is taken by a conditional update before the mail goes, so two overlapping cron jobs do not both send it; a
mail that fails to send gives the mark back.

Triggered by `runs_health --alert`, so the cron line that watches health also sends the alerts.
"""

from __future__ import annotations

import logging
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime

from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from durableruns import conf, services, store
from durableruns.clock import Clock
from durableruns.models import Escalation, RunState
from durableruns.ops.health import age_text, stop_kind

log = logging.getLogger("durableruns")

PERMISSION = "durableruns.decide_escalation"
RETRY_PERMISSION = "durableruns.retry_run"  # who may act on a run stopped for staff: retry it (or cancel it)


@dataclass(kw_only=True)
class AlertReport:
    sent: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)  # escalation id, recipients
    failed: list[tuple[int, str]] = field(default_factory=list)
    due: int = 0  # escalations open past the period and not mailed within it
    recipients: tuple[str, ...] = ()
    stopped: StoppedAlerts | None = None  # runs stopped for staff with no escalation (send_alerts)
    deadlines: DeadlineAlerts | None = None  # runs a deadline ended (send_alerts)

    def summary(self) -> str:
        lines = [self._escalations(), *(part.summary() for part in (self.stopped, self.deadlines) if part)]
        return "; ".join(lines)

    def _escalations(self) -> str:
        if not self.due:
            return "alerts: no escalation to mail about"
        if not self.recipients:
            return (
                f"alerts: {self.due} escalation(s) open too long, but no active user with an e-mail address may "
                f"decide them ({PERMISSION}); nothing sent"
            )
        failed = f", {len(self.failed)} failed to send" if self.failed else ""
        return f"alerts: mailed {len(self.sent)} escalation(s) to {len(self.recipients)} person(s){failed}"


@dataclass(kw_only=True)
class StoppedAlerts:
    sent: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)  # run_id, recipients
    failed: list[tuple[str, str]] = field(default_factory=list)
    due: int = 0  # runs stopped past the period and not mailed within it
    recipients: tuple[str, ...] = ()

    def summary(self) -> str:
        if not self.due:
            return "no stopped run to mail about"
        if not self.recipients:
            return (
                f"{self.due} run(s) stopped for staff too long, but no active user with an e-mail address may "
                f"retry them ({RETRY_PERMISSION}); nothing sent"
            )
        failed = f", {len(self.failed)} failed to send" if self.failed else ""
        return f"mailed {len(self.sent)} stopped run(s) to {len(self.recipients)} person(s){failed}"


@dataclass(kw_only=True)
class DeadlineAlerts(StoppedAlerts):
    """The runs a deadline ended (durableruns.deadlines), each mailed once to the staff who may retry it."""

    def summary(self) -> str:
        if not self.due:
            return "no run ended at its deadline to mail about"
        if not self.recipients:
            return (
                f"{self.due} run(s) ended at their deadline, but no active user with an e-mail address may "
                f"retry them ({RETRY_PERMISSION}); nothing sent"
            )
        failed = f", {len(self.failed)} failed to send" if self.failed else ""
        return f"mailed {len(self.sent)} run(s) ended at their deadline to {len(self.recipients)} person(s){failed}"


def deciders(permission: str = PERMISSION) -> tuple[str, ...]:
    """The e-mail addresses of the active users who hold `permission` (by default: may decide escalations),
    sorted."""
    user_model = get_user_model()
    email_field = user_model.get_email_field_name()
    users = user_model._default_manager.exclude(**{email_field: ""}).exclude(**{f"{email_field}__isnull": True})
    if hasattr(user_model, "is_active"):
        users = users.filter(is_active=True)
    names = {f.name for f in user_model._meta.get_fields()}
    if {"is_superuser", "user_permissions", "groups"} <= names:  # PermissionsMixin: narrow it down in SQL first
        app_label, codename = permission.split(".", 1)
        held = {"codename": codename, "content_type__app_label": app_label}
        users = users.filter(
            Q(is_superuser=True)
            | Q(**{f"user_permissions__{k}": v for k, v in held.items()})
            | Q(**{f"groups__permissions__{k}": v for k, v in held.items()})
        ).distinct()
    # Then ask the authentication backends, as the admin does when the person opens the page.
    return tuple(sorted({getattr(u, email_field) for u in users if u.has_perm(permission)}))


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


def send_alerts(*, clock: Clock | None = None) -> AlertReport:
    """Mail what waits on staff too long: each escalation (send_escalation_alerts), then each run stopped for
    staff with no escalation (send_stopped_alerts), then each run a deadline ended (send_deadline_alerts); one
    report of all three."""
    report = send_escalation_alerts(clock=clock)
    report.stopped = send_stopped_alerts(clock=clock)
    report.deadlines = send_deadline_alerts(clock=clock)
    return report


def run_url(run_id: str) -> str:
    return conf.admin_base_url() + reverse("admin:durableruns_runstate_change", args=[run_id])


def stopped_message(run: RunState, *, now: datetime, recipients: tuple[str, ...]) -> EmailMessage:
    """The mail about one run stopped for staff: where it stands, why it stopped, where to retry or cancel it."""
    sentence = services.boundary_of(run).sentence(timezone.get_current_timezone())
    waited = age_text(now - run.updated_at)
    body = "\n".join(
        [
            f"Run {spelled(run.run_id)} ({run.workflow}) has stood stopped for staff for {waited}, with no "
            f"escalation to decide.",
            "",
            f"Where it stands: {sentence}.",
            f"Why it stopped ({stop_kind(run.reason).replace('_', ' ')}): {run.reason or '-'}",
            "",
            f"Retry it (once its cause is dealt with) or cancel it here: {run_url(run.run_id)}",
            "",
            f"You receive this because you may retry runs ({RETRY_PERMISSION}). It is sent again at most once every "
            f"{age_text(conf.escalation_alert_period())} while the run stays stopped.",
        ]
    )
    subject = f"[durableruns] {spelled(run.run_id)}: stopped for staff ({waited})"
    return EmailMessage(subject=subject, body=body, to=list(recipients))


def send_stopped_alerts(*, clock: Clock | None = None) -> StoppedAlerts:
    """Mail each run stopped for staff with no escalation for longer than the period, and not mailed within it
    (or since it last stopped), to the staff who may retry it; one mail per run."""
    period = conf.escalation_alert_period()
    now = (clock or Clock()).now()
    stale = now - period
    due = list(
        RunState.objects.stopped_unasked()
        .filter(updated_at__lte=stale)
        .filter(Q(alerted_at__isnull=True) | Q(alerted_at__lte=stale) | Q(alerted_at__lt=F("updated_at")))
        .prefetch_related("attempts")
    )
    report = StoppedAlerts(due=len(due))
    if not due:
        return report
    report.recipients = deciders(RETRY_PERMISSION)
    if not report.recipients:
        log.warning("%s run(s) stopped for staff too long and nobody with an e-mail address may retry them", len(due))
        return report
    for run in due:
        previous = run.alerted_at
        if not store.take_run_alert_mark(run.run_id, previous=previous, now=now):
            continue  # another pass sent it, or the run moved on
        try:
            stopped_message(run, now=now, recipients=report.recipients).send(fail_silently=False)
        except Exception as exc:  # an SMTP outage: give the mark back so the next pass tries again
            store.give_run_alert_mark_back(run.run_id, now=now, previous=previous)
            report.failed.append((run.run_id, f"{type(exc).__name__}: {exc}"))
            log.error("run %s: the alert mail was not sent: %s", run.run_id, exc)
            continue
        report.sent.append((run.run_id, report.recipients))
    return report


def deadline_message(run: RunState, *, recipients: tuple[str, ...]) -> EmailMessage:
    """The mail about one run its deadline ended: how far it got, why it ended, where to look at it."""
    sentence = services.boundary_of(run).sentence(timezone.get_current_timezone())
    body = "\n".join(
        [
            f"Run {spelled(run.run_id)} ({run.workflow}) did not end before its deadline: it ended {run.status}.",
            "",
            f"Why: {run.reason}",
            f"How far it got: {sentence}.",
            "",
            f"Its page (what it gave back, its child runs; restart or retry it from there): {run_url(run.run_id)}",
            "",
            f"You receive this because you may retry runs ({RETRY_PERMISSION}). It is sent once.",
        ]
    )
    subject = f"[durableruns] {spelled(run.run_id)}: {run.status} at its deadline"
    return EmailMessage(subject=subject, body=body, to=list(recipients))


def send_deadline_alerts(*, clock: Clock | None = None) -> DeadlineAlerts:
    """Mail each run a deadline ended (durableruns.deadlines), once, to the staff who may retry it. With nobody to
    tell, the runs stay unmarked, and a later pass mails them once someone may."""
    due = store.ended_at_deadline_unmailed()
    report = DeadlineAlerts(due=len(due))
    if not due:
        return report
    report.recipients = deciders(RETRY_PERMISSION)
    if not report.recipients:
        log.warning("%s run(s) ended at their deadline and nobody with an e-mail address may retry them", len(due))
        return report
    now = (clock or Clock()).now()
    for run in due:
        if not store.take_deadline_alert_mark(run.run_id, now=now):
            continue  # another pass sent it
        try:
            deadline_message(run, recipients=report.recipients).send(fail_silently=False)
        except Exception as exc:  # an SMTP outage: give the mark back so the next pass tries again
            store.give_run_alert_mark_back(run.run_id, now=now, previous=None)
            report.failed.append((run.run_id, f"{type(exc).__name__}: {exc}"))
            log.error("run %s: the deadline alert mail was not sent: %s", run.run_id, exc)
            continue
        report.sent.append((run.run_id, report.recipients))
    return report
