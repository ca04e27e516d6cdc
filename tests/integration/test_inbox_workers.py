"""The inbox's reminders and moves across real worker processes (issue 33): at an item's due time one mail to
its group's members, at its escalation moment one move to the next group (a recorded reassignment) and one mail
to that group; once each, whatever the number of workers, with one of three killed by SIGKILL on the way."""

from __future__ import annotations

import signal
import time

import pytest
from django.contrib.auth.models import Group, Permission, User

import durableruns
from durableruns.models import InboxItem, Intervention, RunState, RunStatus, WorkerPresence
from tests import inbox_workflows as flows
from tests import mailbox
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

MODULES = "tests.workflows,tests.inbox_workflows"
RUNS = 3


def person(name: str, group: str) -> User:
    user = User.objects.create_user(username=name, email=f"{name}@example.com")
    user.user_permissions.add(Permission.objects.get(content_type__app_label="durableruns",
                                                     codename="decide_approval"))
    user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


def test_a_reminder_and_a_move_happen_once_across_three_workers_one_killed(workers, tmp_path):
    person("mia", flows.MANAGERS)
    person("dan", flows.DIRECTORS)
    box = tmp_path / "mailbox.jsonl"
    env = {"DURABLERUNS_WORKFLOW_MODULES": MODULES, "TEST_INBOX_DUE_SECONDS": "3",
           "DURABLERUNS_STUCK_MARGIN_SECONDS": "0.6", "EMAIL_BACKEND": "tests.mailbox.EmailBackend",
           "TEST_MAILBOX": str(box)}
    procs = [workers.start("--loop", "--interval", "0.2", **env) for _ in range(3)]
    wait_until(lambda: WorkerPresence.objects.count() >= 3, timeout=60, what="three workers to be up")
    run_ids = [durableruns.start("inbox_order", {"desk": "north", "n": i}) for i in range(RUNS)]
    wait_until(lambda: InboxItem.objects.filter(run_id__in=run_ids).count() == RUNS, timeout=30,
               what="every run to wait for its approval")
    victim = procs[0]
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    assert victim.returncode == -signal.SIGKILL
    items = InboxItem.objects.filter(run_id__in=run_ids)
    wait_until(lambda: items.filter(moved_at__isnull=False, reminded_at__isnull=False).count() == RUNS,
               timeout=40, what="every item to be reminded of and moved")
    wait_until(lambda: len(mailbox.read(box)) >= 2 * RUNS, timeout=20, what="the mails of the moves")
    time.sleep(3)  # the two workers left look several more times: nothing is sent or moved twice
    mails = mailbox.read(box)
    assert len(mails) == 2 * RUNS, mails
    for item in items:
        assert item.group == flows.DIRECTORS and item.claimed_by == ""
        assert item.due_at <= item.reminded_at and item.escalate_at <= item.moved_at
        moves = Intervention.objects.filter(run_id=item.run_id, action="reassign")
        assert [(m.decided_by, m.result["from"], m.result["to"]) for m in moves] == [
            ("durableruns", flows.MANAGERS, flows.DIRECTORS)]
        about = [m for m in mails if item.run_id in m["subject"]]
        reminders = [m for m in about if m["subject"].endswith("is due")]
        moved = [m for m in about if "moved to" in m["subject"]]
        assert len(reminders) == 1 and len(moved) == 1, about
        assert reminders[0]["to"] == ["mia@example.com"] and moved[0]["to"] == ["dan@example.com"]
    assert len({m["pid"] for m in mails} - {victim.pid}) >= 1
    assert all(RunState.objects.get(pk=r).status == RunStatus.WAITING for r in run_ids)
