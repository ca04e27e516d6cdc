"""An alert about a run whose recorded id holds a control character (recorded before start() refused them) is
sent, with the character spelled out in the subject: a newline in a header would fail every mail about the run,
for ever (locmem mail)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.utils import timezone

from durableruns.models import RunState, RunStatus
from durableruns.ops import alerts
from durableruns.registry import get_workflow
from tests.ops.records import escalate

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def site(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.DURABLERUNS_ADMIN_BASE_URL = "https://ops.example.com/"
    settings.DEFAULT_FROM_EMAIL = "durableruns@example.com"


def recorded_run(run_id: str) -> str:
    """A run written as an older version (or another client of the table) could have, id and all."""
    workflow = get_workflow("scripted")
    now = timezone.now()
    RunState.objects.create(
        run_id=run_id,
        workflow=workflow.name,
        plan_fingerprint=workflow.fingerprint,
        input={},
        status=RunStatus.NEEDS_DECISION,
        cursor=1,
        created_at=now,
        updated_at=now,
    )
    return run_id


@pytest.mark.parametrize(
    ("run_id", "spelled"),
    [
        ("po\n41", "po\\n41"),
        ("po-41\r\nBcc: someone@example.com", "po-41\\r\\nBcc: someone@example.com"),
        ("po\x1b[2J41", "po\\x1b[2J41"),
        ("po\u202841", "po\\u202841"),
    ],
)
def test_the_alert_about_a_run_with_a_control_character_in_its_id_is_sent_with_it_spelled_out(run_id, spelled):
    User.objects.create_superuser("root", "root@example.com", "pw-root-9f3")
    escalation = escalate(recorded_run(run_id), opened_ago=timedelta(days=1))
    report = alerts.send_escalation_alerts()
    assert report.failed == [] and report.sent == [(escalation.pk, ("root@example.com",))], report
    [sent] = mail.outbox
    assert sent.subject.startswith(f"[durableruns] {spelled}: second waits for a decision ("), sent.subject
    headers = sent.message().as_string().split("\n\n", 1)[0]  # what the SMTP backend would send
    assert not any(line.startswith("Bcc:") for line in headers.splitlines()) and sent.to == ["root@example.com"]
    assert f"Run {spelled} (scripted)" in sent.body
    # The mark is taken: the next pass sends nothing until the period has passed again.
    assert alerts.send_escalation_alerts().sent == []
