"""The inbox through the API (issue 33): approvals and escalations assigned as they open, due on the database's
clock, taken and released by one person at a time; a decision by anyone but the holder refused and recording
nothing, a superuser's recorded as an override; runs out of scope in no list."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db import connections

import durableruns
from durableruns import inbox, services
from durableruns.errors import ItemTaken
from durableruns.models import InboxItem, Intervention, RunState, RunStatus, RunStep
from tests import inbox_workflows as flows
from tests.api.conftest import READ, user_with
from tests.factories import crash_after_intent

pytestmark = pytest.mark.django_db(transaction=True)

ACTS = ("take", "release", "reassign", "override", "approve", "reject")


def member(name: str, *groups: str, perms: tuple[str, ...] = ("decide_approval", "decide_escalation")):
    user = user_with(name, *READ, *perms)
    for group in groups:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


@pytest.fixture
def alice():
    return member("alice", flows.MANAGERS)


@pytest.fixture
def bob():
    return member("bob", flows.MANAGERS)


@pytest.fixture
def carol():
    """May decide approvals, but is not a purchasing manager."""
    return member("carol")


def waiting_for_approval(desk: str = "north", **input) -> InboxItem:
    run_id = durableruns.start("inbox_order", {"desk": desk, **input})
    services.resume_due(run_id=run_id)
    assert RunState.objects.get(pk=run_id).status == RunStatus.WAITING
    return InboxItem.objects.get(run_id=run_id)


def escalated(desk: str = "north") -> InboxItem:
    """A run whose escalate step crashed after its intent: the engine escalates it, asking assign_to of ctx."""
    item = waiting_for_approval(desk)
    services.decide(item.run_id, "manager_approval", "approve", by="alice", note="fine")
    run_id = item.run_id
    RunState.objects.filter(pk=run_id).update(status=RunStatus.PENDING)
    crash_after_intent(run_id, "notify_buyer", cursor=2)
    services.resume_due(run_id=run_id)
    assert RunState.objects.get(pk=run_id).status == RunStatus.NEEDS_DECISION
    return InboxItem.objects.get(run_id=run_id, kind="escalation")


def acts(run_id: str) -> list[str]:
    return list(
        Intervention.objects.filter(run_id=run_id, action__in=ACTS).order_by("pk").values_list("action", flat=True)
    )


def test_an_approval_opens_assigned_and_due_on_the_databases_clock():
    item = waiting_for_approval()
    assert item.kind == "approval" and item.group == flows.MANAGERS and item.escalate_to == flows.DIRECTORS
    begun = item.run.attempts.get(step="manager_approval")
    assert timedelta(0) <= item.opened_at - begun.started_at < timedelta(seconds=1)  # the same commit
    assert item.due_at - item.opened_at == flows.DUE
    assert item.escalate_at - item.opened_at == 2 * flows.DUE
    assert item.claimed_by == "" and item.reminded_at is None and item.moved_at is None
    # asked once: a second pass over the waiting run opens nothing more
    services.resume_due(run_id=item.run_id)
    assert InboxItem.objects.filter(run_id=item.run_id).count() == 1


def test_an_escalation_is_assigned_by_a_function_of_ctx_and_closed_by_its_decision(settings):
    settings.DURABLERUNS_DEFAULT_ASSIGNEE = "Everyone else"
    item = escalated(desk="Desk south")
    assert item.group == "Desk south" and item.escalation is not None and item.escalate_to == ""
    assert item.due_at - item.opened_at == flows.DUE
    services.resolve_escalation(item.escalation.pk, "happened", by="someone", note="seen it")
    assert InboxItem.objects.get(pk=item.pk).closed_at is not None


def test_the_default_assignee_takes_what_names_no_group(settings):
    settings.DURABLERUNS_DEFAULT_ASSIGNEE = "Back office"
    run_id = durableruns.start("inbox_payroll", {})
    services.resume_due(run_id=run_id)
    assert InboxItem.objects.get(run_id=run_id).group == "Back office"


def test_the_list_is_the_callers_the_overdue_first_then_by_due_time(client_for, alice, carol):
    late, soon, never = waiting_for_approval(), waiting_for_approval(), waiting_for_approval()
    InboxItem.objects.filter(pk=late.pk).update(due_at=late.opened_at - timedelta(minutes=5))
    InboxItem.objects.filter(pk=never.pk).update(due_at=None)
    payroll = durableruns.start("inbox_payroll", {})
    services.resume_due(run_id=payroll)
    response = client_for(alice).get("/api/inbox/?mine=1")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"next", "previous", "results"}
    rows = body["results"]
    assert [r["id"] for r in rows[:3]] == [late.pk, soon.pk, InboxItem.objects.get(run_id=payroll).pk]
    assert rows[-1]["id"] == never.pk
    first = rows[0]
    assert first["overdue"] is True and rows[1]["overdue"] is False
    assert first["kind"] == "approval" and first["run_id"] == late.run_id and first["workflow"] == "inbox_order"
    assert first["attributes"] == {"desk": "north"} and first["step"] == "manager_approval"
    assert first["assigned_to"] == flows.MANAGERS and first["holder"] is None
    assert first["escalate_to"] == flows.DIRECTORS
    # carol is not a purchasing manager: the managers' items are not hers, the unassigned one is
    mine = client_for(carol).get("/api/inbox/?mine=1").json()["results"]
    assert [r["id"] for r in mine] == [InboxItem.objects.get(run_id=payroll).pk]
    assert len(client_for(carol).get("/api/inbox/").json()["results"]) == 4  # all she may decide


def test_take_and_release_are_recorded_staff_acts(client_for, alice, bob):
    item = waiting_for_approval()
    took = client_for(alice).post(f"/api/inbox/{item.pk}/claim/")
    assert took.status_code == 200, took.content
    assert took.json()["holder"]["by"] == "alice" and took.json()["holder"]["since"]
    assert client_for(alice).post(f"/api/inbox/{item.pk}/claim/").status_code == 200  # hers already
    refused = client_for(bob).post(f"/api/inbox/{item.pk}/claim/")
    assert refused.status_code == 409
    body = refused.json()
    assert body["code"] == "taken" and body["held_by"] == "alice" and body["held_since"]
    assert "taken by alice since" in body["detail"]
    assert client_for(bob).post(f"/api/inbox/{item.pk}/release/").status_code == 409  # not his to release
    # bob's list no longer shows what alice holds
    assert client_for(bob).get("/api/inbox/?mine=1").json()["results"] == []
    released = client_for(alice).post(f"/api/inbox/{item.pk}/release/")
    assert released.status_code == 200 and released.json()["holder"] is None
    assert client_for(bob).post(f"/api/inbox/{item.pk}/claim/").status_code == 200
    assert acts(item.run_id) == ["take", "release", "take"]
    taken = Intervention.objects.filter(run_id=item.run_id, action="take").order_by("pk")
    assert [(a.decided_by, a.user_id) for a in taken] == [("alice", alice.pk), ("bob", bob.pk)]


def test_someone_outside_the_group_is_refused_403_and_nothing_is_recorded(client_for, carol, outsider):
    item = waiting_for_approval()
    refused = client_for(carol).post(f"/api/inbox/{item.pk}/claim/")
    assert refused.status_code == 403 and refused.json()["code"] == "not_assigned"
    assert client_for(outsider).post(f"/api/inbox/{item.pk}/claim/").status_code == 403
    assert client_for(outsider).get("/api/inbox/").status_code == 403
    assert InboxItem.objects.get(pk=item.pk).claimed_by == "" and acts(item.run_id) == []
    assert client_for(carol).post("/api/inbox/999999/claim/").status_code == 404


def test_two_people_taking_one_item_at_once_one_wins_the_other_is_refused(alice, bob):
    item = waiting_for_approval()
    barrier = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def take(user):
        try:
            barrier.wait()
            inbox.take(item.pk, user=user)
            outcomes[user.username] = "took"
        except ItemTaken as exc:
            outcomes[user.username] = f"refused: {exc.held_by}"
        finally:
            connections.close_all()

    threads = [threading.Thread(target=take, args=(u,)) for u in (alice, bob)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winner = InboxItem.objects.get(pk=item.pk).claimed_by
    loser = "bob" if winner == "alice" else "alice"
    assert outcomes == {winner: "took", loser: f"refused: {winner}"}
    assert acts(item.run_id) == ["take"]


def test_a_decision_by_anyone_but_the_holder_is_refused_and_records_nothing(client_for, alice, bob):
    item = waiting_for_approval()
    client_for(alice).post(f"/api/inbox/{item.pk}/claim/")
    body = {"step": "manager_approval", "outcome": "approve", "note": "looks fine"}
    refused = client_for(bob).post(f"/api/runs/{item.run_id}/decide/", body, format="json")
    assert refused.status_code == 409 and refused.json()["code"] == "taken"
    assert refused.json()["held_by"] == "alice"
    assert acts(item.run_id) == ["take"]
    assert InboxItem.objects.get(pk=item.pk).closed_at is None
    assert RunState.objects.get(pk=item.run_id).status == RunStatus.WAITING
    decided = client_for(alice).post(f"/api/runs/{item.run_id}/decide/", body, format="json")
    assert decided.status_code == 200, decided.content
    assert acts(item.run_id) == ["take", "approve"]
    assert InboxItem.objects.get(pk=item.pk).closed_at is not None
    assert client_for(alice).get("/api/inbox/").json()["results"] == []


def test_an_escalation_held_by_another_is_refused_too(client_for, bob):
    item = escalated(desk=flows.MANAGERS)
    desk = member("dora", flows.MANAGERS)
    assert client_for(desk).post(f"/api/inbox/{item.pk}/claim/").status_code == 200
    body = {"outcome": "happened", "note": "it went out"}
    refused = client_for(bob).post(f"/api/escalations/{item.escalation.pk}/decide/", body, format="json")
    assert refused.status_code == 409 and refused.json()["held_by"] == "dora"
    assert not Intervention.objects.filter(escalation=item.escalation).exists()


def test_a_superusers_decision_of_a_held_item_is_recorded_as_an_override(client_for, alice, superuser):
    item = waiting_for_approval()
    client_for(alice).post(f"/api/inbox/{item.pk}/claim/")
    body = {"step": "manager_approval", "outcome": "reject", "note": "over budget"}
    decided = client_for(superuser).post(f"/api/runs/{item.run_id}/decide/", body, format="json")
    assert decided.status_code == 200, decided.content
    assert acts(item.run_id) == ["take", "override", "reject"]
    override = Intervention.objects.get(run_id=item.run_id, action="override")
    assert override.decided_by == "root" and override.user_id == superuser.pk
    assert override.result == {"item": item.pk, "held_by": "alice"} and "alice held" in override.note


def test_items_of_runs_out_of_scope_are_in_no_list_or_count(client_for, settings, alice):
    settings.DURABLERUNS_WORKFLOW_GROUPS = {"inbox_payroll": ["Payroll"]}
    payroll = durableruns.start("inbox_payroll", {})
    services.resume_due(run_id=payroll)
    item = InboxItem.objects.get(run_id=payroll)
    assert client_for(alice).get("/api/inbox/").json()["results"] == []
    assert client_for(alice).get("/api/inbox/?mine=1").json()["results"] == []
    assert inbox.count(alice) == 0
    assert client_for(alice).post(f"/api/inbox/{item.pk}/claim/").status_code == 404
    assert client_for(alice).post(f"/api/inbox/{item.pk}/release/").status_code == 404
    paid = member("paula", "Payroll")
    assert [r["id"] for r in client_for(paid).get("/api/inbox/?mine=1").json()["results"]] == [item.pk]
    assert inbox.count(paid) == 1


def test_bad_input_is_a_400_or_404_never_a_500(client_for, alice):
    assert client_for(alice).get("/api/inbox/?mine=perhaps").status_code == 400
    assert client_for(alice).post("/api/inbox/abc/claim/").status_code == 404


def test_a_superuser_may_release_what_another_holds_and_that_is_recorded(client_for, alice, superuser):
    item = waiting_for_approval()
    assert client_for(alice).post(f"/api/inbox/{item.pk}/release/").json()["holder"] is None  # nobody held it
    assert acts(item.run_id) == []  # nothing changed, nothing recorded
    client_for(alice).post(f"/api/inbox/{item.pk}/claim/")
    released = client_for(superuser).post(f"/api/inbox/{item.pk}/release/")
    assert released.status_code == 200 and released.json()["holder"] is None
    act = Intervention.objects.get(run_id=item.run_id, action="release")
    assert act.decided_by == "root" and act.result == {"item": item.pk, "held_by": "alice"}
    assert "alice held" in act.note


def test_retention_deletes_an_ended_runs_items_with_it(settings):
    from durableruns.ops import prune

    settings.DURABLERUNS_PRUNE_EVIDENCE_DAYS = 1
    item = waiting_for_approval()
    services.decide(item.run_id, "manager_approval", "reject", by="alice", note="no")
    services.resume_due(run_id=item.run_id)
    assert RunState.objects.get(pk=item.run_id).status == RunStatus.CANCELLED
    RunState.objects.filter(pk=item.run_id).update(updated_at=item.opened_at - timedelta(days=400))
    report = prune.prune(older_than_days=30)
    assert report.inbox_items == 1
    assert not InboxItem.objects.filter(run_id=item.run_id).exists()


def test_the_sweep_never_closes_an_item_whose_attempt_it_does_not_see(alice):
    """On a Citus cluster a sweep may see an item before the attempt its commit began (they live on different
    nodes): staleness is a fact seen (the attempt over, the run ended), never an attempt not seen. Here the
    attempt is hidden from the sweep as it would be there, by taking it out of the record for a moment."""
    item = waiting_for_approval()
    attempt = RunStep.objects.filter(run_id=item.run_id, step=item.step, attempt=item.attempt)
    (row,) = attempt.values()
    attempt.delete()
    assert inbox.sweep().closed == 0
    RunStep.objects.create(**row)
    assert InboxItem.objects.get(pk=item.pk).closed_at is None
    assert InboxItem.objects.open().filter(pk=item.pk).exists()


def test_the_sweep_closes_the_items_of_runs_that_ended_otherwise(alice):
    item = waiting_for_approval()
    other = waiting_for_approval()
    services.cancel_run(item.run_id, by="alice", note="not needed")
    swept = inbox.sweep()
    assert swept.closed == 1 and swept.reminded == [] and swept.moved == []
    assert InboxItem.objects.get(pk=item.pk).closed_at is not None
    assert InboxItem.objects.get(pk=other.pk).closed_at is None
