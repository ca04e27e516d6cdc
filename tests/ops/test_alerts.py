"""Escalation alerts (runs_health --alert): one mail per escalation open too long, to exactly the people who may
decide it, with the run's sentence and a link to its decision page; at most once per period (locmem mail)."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core import mail
from django.core.management import call_command
from django.core.management.base import CommandError

from durableruns.clock import Clock
from durableruns.models import Escalation, RunState, RunStatus
from durableruns.ops import alerts
from tests.admin.users import OPERATE, VIEW, staff
from tests.ops.records import aged_run, escalate, stopped_by_crash_budget

pytestmark = pytest.mark.django_db(transaction=True)

PERIOD = timedelta(hours=4)


@pytest.fixture(autouse=True)
def site(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.DURABLERUNS_ADMIN_BASE_URL = "https://ops.example.com/"
    settings.DEFAULT_FROM_EMAIL = "durableruns@example.com"


def with_email(user: User, email: str) -> User:
    user.email = email
    user.save()
    return user


@pytest.fixture
def people() -> dict[str, User]:
    """Everyone the permission rules tell apart."""
    decide = Permission.objects.get(content_type__app_label="durableruns", codename="decide_escalation")
    deciders = Group.objects.create(name="deciders")
    deciders.permissions.add(decide)
    grouped = with_email(staff("gina", *VIEW), "gina@example.com")
    grouped.groups.add(deciders)
    return {
        "operator": with_email(staff("alice", *OPERATE), "alice@example.com"),
        "grouped": grouped,
        "root": User.objects.create_superuser("root", "root@example.com", "pw-root-9f3"),
        "viewer": with_email(staff("viola", *VIEW), "viola@example.com"),
        "canceller": with_email(staff("carl", "view_runstate", "cancel_run"), "carl@example.com"),
        "gone": with_email(User.objects.create_user("gone", is_active=False), "gone@example.com"),
        "no_address": staff("nadia", *OPERATE),
        "plain": with_email(User.objects.create_user("pat"), "pat@example.com"),
    }


def gone_after_perm(people: dict[str, User]) -> None:
    decide = Permission.objects.get(content_type__app_label="durableruns", codename="decide_escalation")
    people["gone"].user_permissions.add(decide)


DECIDERS = ["alice@example.com", "gina@example.com", "root@example.com"]


def stuck(hours: float, **kwargs) -> Escalation:
    run = aged_run(RunStatus.NEEDS_DECISION, attempts=2)
    return escalate(run, opened_ago=timedelta(hours=hours), **kwargs)


def test_an_escalation_open_past_the_period_is_mailed_once_to_exactly_who_may_decide(people):
    gone_after_perm(people)
    escalation = stuck(5)
    report = alerts.send_escalation_alerts()
    assert report.sent == [(escalation.pk, tuple(DECIDERS))]
    [sent] = mail.outbox
    assert sorted(sent.to) == DECIDERS
    assert not sent.cc and not sent.bcc
    assert sent.from_email == "durableruns@example.com"
    assert escalation.run_id in sent.subject and "second waits for a decision (5h 0m)" in sent.subject
    assert f"https://ops.example.com/admin/durableruns/escalation/{escalation.pk}/change/" in sent.body
    assert "nobody can look it up" in sent.body
    # The same pass again, and a pass an hour later: nothing more.
    assert alerts.send_escalation_alerts().sent == []
    assert alerts.send_escalation_alerts(clock=Clock(shift=timedelta(hours=1))).sent == []
    assert len(mail.outbox) == 1


def test_the_mail_carries_the_runs_sentence_as_the_admin_shows_it(people):
    from django.utils import timezone

    from durableruns import services

    escalation = stuck(6)
    alerts.send_escalation_alerts()
    [sent] = mail.outbox
    sentence = services.boundary_of(escalation.run).sentence(timezone.get_current_timezone())
    assert f"Where it stands: {sentence}." in sent.body


def test_it_is_mailed_again_once_per_period_while_it_stays_open(people):
    escalation = stuck(5)
    alerts.send_escalation_alerts()
    later = Clock(shift=PERIOD + timedelta(minutes=1))
    assert [pk for pk, _ in alerts.send_escalation_alerts(clock=later).sent] == [escalation.pk]
    assert alerts.send_escalation_alerts(clock=later).sent == []
    assert len(mail.outbox) == 2


def test_a_young_or_decided_escalation_is_not_mailed(people):
    stuck(1)
    stuck(30, decided=True)
    report = alerts.send_escalation_alerts()
    assert report.sent == [] and report.due == 0
    assert mail.outbox == []


def test_the_period_is_a_setting(people, settings):
    settings.DURABLERUNS_ESCALATION_ALERT_SECONDS = 600
    escalation = stuck(0.5)
    assert [pk for pk, _ in alerts.send_escalation_alerts().sent] == [escalation.pk]


def test_with_nobody_to_tell_nothing_is_sent_and_the_escalation_stays_unmarked(settings):
    with_email(staff("viola", *VIEW), "viola@example.com")
    escalation = stuck(5)
    report = alerts.send_escalation_alerts()
    assert report.sent == [] and report.due == 1
    assert "nothing sent" in report.summary()
    assert mail.outbox == []
    escalation.refresh_from_db()
    assert escalation.alerted_at is None  # so a decider added later is told at once


def test_a_mail_that_fails_gives_the_mark_back(people, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", 1, 2
    escalation = stuck(5)
    report = alerts.send_escalation_alerts()
    assert [pk for pk, _ in report.failed] == [escalation.pk] and report.sent == []
    escalation.refresh_from_db()
    assert escalation.alerted_at is None
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    assert [pk for pk, _ in alerts.send_escalation_alerts().sent] == [escalation.pk]


def test_one_mail_per_escalation(people):
    first, second = stuck(5), stuck(9)
    report = alerts.send_escalation_alerts()
    assert sorted(pk for pk, _ in report.sent) == sorted([first.pk, second.pk])
    assert sorted(m.subject.split(":")[0] for m in mail.outbox) == sorted(
        f"[durableruns] {e.run_id}" for e in (first, second)
    )


def test_runs_health_alert_sends_them_and_still_reports_health(people):
    escalation = stuck(5)
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("runs_health", "--alert", stdout=out, stderr=err)
    assert raised.value.returncode == 1
    assert out.getvalue().startswith("WARNING escalation: 1 escalation(s) open")
    assert "alerts: mailed 1 escalation(s) to 3 person(s)" in err.getvalue()
    assert len(mail.outbox) == 1
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("runs_health", "--alert", "--json", stdout=out, stderr=StringIO())
    data = json.loads(out.getvalue())
    assert data["alerts"]["sent"] == [] and data["status"] == "warning"
    assert len(mail.outbox) == 1
    escalation.refresh_from_db()
    assert escalation.alerted_at is not None


def test_without_alert_runs_health_sends_nothing(people):
    stuck(5)
    with pytest.raises(CommandError):
        call_command("runs_health", stdout=StringIO(), stderr=StringIO())
    assert mail.outbox == []


def test_a_run_stopped_for_staff_with_no_escalation_is_mailed_with_its_reason_to_who_may_retry_it(people, settings):
    run = stopped_by_crash_budget(settings)
    settings.DURABLERUNS_ESCALATION_ALERT_SECONDS = 0
    report = alerts.send_alerts()
    assert report.stopped.sent == [(run, ("alice@example.com", "root@example.com"))]  # who hold retry_run
    [message] = mail.outbox
    assert message.subject.startswith(f"[durableruns] {run}: stopped for staff")
    assert "Why it stopped (crash budget): first ended in doubt 1 times" in message.body
    assert f"https://ops.example.com/admin/durableruns/runstate/{run}/change/" in message.body
    settings.DURABLERUNS_ESCALATION_ALERT_SECONDS = 3600
    assert alerts.send_alerts().stopped.sent == [] and len(mail.outbox) == 1  # once per period
    # Retried and stopped again: the new stop is mailed after the period, whatever the last mail
    now = Clock().now()
    RunState.objects.filter(pk=run).update(alerted_at=now - timedelta(hours=3), updated_at=now - timedelta(hours=2))
    assert alerts.send_alerts().stopped.sent == [(run, ("alice@example.com", "root@example.com"))]


def test_runs_health_alert_mails_stopped_runs_too(people, settings):
    run = stopped_by_crash_budget(settings)
    settings.DURABLERUNS_ESCALATION_ALERT_SECONDS = 0
    out = StringIO()
    with pytest.raises(CommandError):  # the stopped run is a warning
        call_command("runs_health", "--alert", "--json", stdout=out, stderr=StringIO())
    data = json.loads(out.getvalue())
    assert data["alerts"]["stopped_runs"]["sent"] == [run] and len(mail.outbox) == 1
