"""The escalation queue and deciding, through Django's test client: what a person sees, who may decide, and
that a decision applies once however many people press a button."""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from durableruns import admin, services
from durableruns.models import Escalation, Intervention, Resolution, RunState, RunStatus, RunStep
from tests.admin.users import OPERATE, logged_in, staff
from tests.admin.records import escalated, purchase_in_doubt

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "/admin/durableruns/escalation/"


def page(escalation: Escalation) -> str:
    return f"{QUEUE}{escalation.pk}/change/"


def queued(response) -> list[int]:
    return [e.pk for e in response.context["cl"].result_list]


def messages_of(response) -> str:
    return " ".join(str(m) for m in response.context["messages"])


def status(run_id: str) -> str:
    return RunState.objects.get(pk=run_id).status


# -- the queue ----------------------------------------------------------------------------------------------


def test_the_queue_lists_open_escalations_oldest_first_and_keeps_decided_ones_a_filter_away(as_viewer: Client):
    first, second, third = escalated("run-1"), escalated("run-2"), escalated("run-3")
    Escalation.objects.filter(pk=second.pk).update(opened_at=first.opened_at - timedelta(minutes=5))
    services.resolve_escalation(third.pk, "abandon", by="bob", note="order withdrawn by the buyer")
    response = as_viewer.get(QUEUE)
    assert response.status_code == 200 and response.context["title"] == "Escalation queue"
    assert queued(response) == [second.pk, first.pk]  # open ones only, the longest wait on top
    decided = as_viewer.get(QUEUE, {"state": "decided"})
    assert queued(decided) == [third.pk]
    html = decided.content.decode()
    assert "abandon the run" in html and "by bob at" in html and "order withdrawn by the buyer" in html
    assert sorted(queued(as_viewer.get(QUEUE, {"state": "all"}))) == sorted([first.pk, second.pk, third.pk])


def test_each_row_carries_what_deciding_needs(far, as_viewer: Client):
    run_id = purchase_in_doubt()
    escalation = Escalation.objects.get(run_id=run_id)
    html = as_viewer.get(QUEUE).content.decode()
    assert "7 steps complete, notify_buyer in doubt since" in html  # the run's sentence
    assert f"<b>notify_buyer</b> since {escalation.in_doubt_since:%Y-%m-%d %H:%M:%S}" in html
    assert f"<code>{run_id}:notify_buyer</code>" in html  # the effect key
    assert "1 attempt so far" in html
    assert "check the sender&#x27;s outbox for a message to the buyer" in html  # how to check by hand
    # What the run holds meanwhile in another system (its stock reservation, and when it lapses), not every done
    # step's result: a charge or a booked shipment is done, not held.
    assert "<b>reserve_stock</b> held since" in html and "reservation_id rs_" in html
    assert re.search(r"lapses in 3 h 5\d min", html)
    assert "charge_id ch_" not in html and "shipment_id sh_" not in html


def test_the_queue_searches_by_run_id_and_effect_key(as_viewer: Client):
    a, b = escalated("run-a"), escalated("run-b")
    assert queued(as_viewer.get(QUEUE, {"q": "run-b:third"})) == [b.pk]
    assert queued(as_viewer.get(QUEUE, {"q": "run-a"})) == [a.pk]


# -- the escalation page ------------------------------------------------------------------------------------


def test_staff_without_the_permission_can_look_but_not_decide(far, as_viewer: Client):
    escalation = Escalation.objects.get(run_id=purchase_in_doubt())
    response = as_viewer.get(page(escalation))
    assert response.status_code == 200 and response.context["form"] is None
    html = response.content.decode()
    assert "sender&#x27;s outbox for a message" in html and "charge_id ch_" in html  # everything is visible
    assert 'name="outcome"' not in html and "It happened" not in html
    assert "deciding needs the permission" in html
    refused = as_viewer.post(page(escalation), {"outcome": "happened", "note": "I checked"})
    assert refused.status_code == 403
    assert not Intervention.objects.exists() and status(escalation.run_id) == RunStatus.NEEDS_DECISION


def offers_to_decide(html: str) -> list[str]:
    """Every link or button on the page that offers to decide, by its text (and any decision form's field)."""
    offers = re.findall(r"<(?:a|button)\b[^>]*>((?:(?!</(?:a|button)>).)*)</(?:a|button)>", html, re.S)
    found = [text for text in offers if re.search(r"\bdecide\b|it happened|did not happen|abandon the run", text, re.I)]
    return found + re.findall(r'name="outcome"', html)


def test_staff_without_the_permission_are_offered_to_decide_nowhere_and_read_everything(far, as_viewer: Client,
                                                                                        as_operator: Client):
    run_id = purchase_in_doubt()
    escalation = Escalation.objects.get(run_id=run_id)
    pages = {"queue": QUEUE, "escalation": page(escalation), "run": f"/admin/durableruns/runstate/{run_id}/change/",
             "runs": "/admin/durableruns/runstate/"}
    for name, url in pages.items():
        response = as_viewer.get(url)
        assert response.status_code == 200, name
        html = response.content.decode()
        assert offers_to_decide(html) == [], name
        if name != "escalation":
            assert f'href="{page(escalation)}"' in html or name == "runs", name  # the escalation stays one click away
    run_page = as_viewer.get(pages["run"]).content.decode()
    assert f"read it (escalation #{escalation.pk})" in run_page
    assert "deciding needs the permission" in as_viewer.get(QUEUE).content.decode()
    # Whoever may decide is offered to, on the run page and on the escalation's.
    run_page = as_operator.get(pages["run"]).content.decode()
    assert f"decide it (escalation #{escalation.pk})" in offers_to_decide(run_page)
    assert 'name="outcome"' in offers_to_decide(as_operator.get(page(escalation)).content.decode())


def test_staff_with_the_permission_see_three_decisions_and_a_required_note(as_operator: Client):
    escalation = escalated("run-a")
    html = as_operator.get(page(escalation)).content.decode()
    for value, label in (("happened", "It happened"), ("did_not_happen", "It did not happen — run it again"),
                         ("abandon", "Abandon the run")):
        assert f'name="outcome" value="{value}"' in html and label in html
    assert 'name="note"' in html and 'name="result"' in html
    response = as_operator.post(page(escalation), {"outcome": "happened", "note": ""})
    assert response.status_code == 200 and "This field is required." in response.content.decode()
    assert not Intervention.objects.exists() and status("run-a") == RunStatus.NEEDS_DECISION


def test_it_happened_with_a_result_is_recorded_and_the_next_resume_completes_the_run(as_operator: Client,
                                                                                     operator: User):
    escalation = escalated("run-a")
    response = as_operator.post(page(escalation), {"outcome": "happened", "note": "found it in the outbox",
                                                   "result": '{"message_id": "msg_41"}'})
    assert response.status_code == 302 and response["Location"] == QUEUE
    decision = Intervention.objects.get(escalation=escalation)
    assert (decision.action, decision.decided_by, decision.user, decision.note, decision.result) == (
        "happened", "alice", operator, "found it in the outbox", {"message_id": "msg_41"})
    assert status("run-a") == RunStatus.PENDING
    services.resume_due()
    assert status("run-a") == RunStatus.COMPLETED
    third = RunStep.objects.get(run_id="run-a", step="third")
    assert (third.status, third.result, third.resolution) == ("completed", {"message_id": "msg_41"},
                                                              Resolution.DECISION)
    after = as_operator.get(page(escalation)).content.decode()
    assert "found it in the outbox" in after and "msg_41" in after and 'name="outcome"' not in after


@pytest.mark.parametrize(
    ("outcome", "final", "attempts"),
    [("did_not_happen", RunStatus.COMPLETED, [(1, "started"), (2, "completed")]),
     ("abandon", RunStatus.CANCELLED, [(1, "started")])],
)
def test_the_other_two_decisions_are_acted_on_by_the_next_resume(as_operator: Client, outcome, final, attempts):
    escalation = escalated("run-a")
    response = as_operator.post(page(escalation), {"outcome": outcome, "note": "checked the outbox"}, follow=True)
    assert "the next resume_runs acts on it" in messages_of(response)
    assert Intervention.objects.get(escalation=escalation).action == outcome
    services.resume_due()
    assert status("run-a") == final
    assert list(RunStep.objects.filter(run_id="run-a", step="third").order_by("attempt")
                .values_list("attempt", "status")) == attempts


def test_a_result_that_is_not_json_is_an_error_and_changes_nothing(as_operator: Client):
    escalation = escalated("run-a")
    response = as_operator.post(page(escalation), {"outcome": "happened", "note": "found it",
                                                   "result": "{message_id: msg_41"})
    assert response.status_code == 200
    html = response.content.decode()
    assert "The result is not valid JSON: nothing was recorded." in html
    assert "{message_id: msg_41" in html  # what was typed stays in the box
    wrong = as_operator.post(page(escalation), {"outcome": "abandon", "note": "n", "result": '{"a": 1}'})
    assert "A result goes only with “it happened”." in wrong.content.decode()
    assert not Intervention.objects.exists() and status("run-a") == RunStatus.NEEDS_DECISION
    assert RunStep.objects.get(run_id="run-a", step="third").status == "started"


@pytest.mark.parametrize("result", ["[" * 10_000 + "]" * 10_000,  # json.loads raises RecursionError
                                    '{"a": ' * 65 + "1" + "}" * 65],  # parses, but too deep to record
                         ids=["10000 levels", "65 levels"])
def test_a_result_nested_too_deep_is_a_form_error_and_changes_nothing(as_operator: Client, result: str):
    escalation = escalated("run-a")
    response = as_operator.post(page(escalation), {"outcome": "happened", "note": "found it", "result": result})
    assert response.status_code == 200
    html = response.content.decode()
    assert "The result is nested more than 64 levels deep: nothing was recorded." in html
    assert result.replace('"', "&quot;") in html  # what was typed stays in the box, as typed
    assert not Intervention.objects.exists() and status("run-a") == RunStatus.NEEDS_DECISION
    nested = '{"a": ' * 64 + "1" + "}" * 64  # as deep as a result may be: recorded, and shown on the page
    assert as_operator.post(page(escalation), {"outcome": "happened", "note": "found it",
                                               "result": nested}).status_code == 302
    assert admin.nesting_depth(Intervention.objects.get().result) == 64
    assert as_operator.get(page(escalation)).status_code == 200


def test_the_second_decision_is_refused_and_names_who_decided_first(as_operator: Client):
    escalation = escalated("run-a")
    bob = logged_in(staff("bob", *OPERATE))
    assert 'name="outcome"' in bob.get(page(escalation)).content.decode()  # both see the open escalation
    as_operator.post(page(escalation), {"outcome": "happened", "note": "in the outbox"})
    late = bob.post(page(escalation), {"outcome": "did_not_happen", "note": "not in the outbox"}, follow=True)
    decided_at = Intervention.objects.get().decided_at
    assert (f"Your decision was not recorded: this escalation was already decided by alice at "
            f"{decided_at:%Y-%m-%d %H:%M:%S}: it happened.") in messages_of(late)
    assert Intervention.objects.get().decided_by == "alice"
    assert status("run-a") == RunStatus.PENDING


def test_two_people_deciding_at_once_exactly_one_applies(as_operator: Client):
    escalation = escalated("run-a")
    bob = logged_in(staff("bob", *OPERATE))
    start = threading.Barrier(2)
    responses: dict[str, object] = {}

    def decide(name: str, client: Client, outcome: str) -> None:
        try:
            start.wait()
            responses[name] = client.post(page(escalation), {"outcome": outcome, "note": f"{name} checked"})
        finally:
            connection.close()  # this thread's own connection

    threads = [threading.Thread(target=decide, args=("alice", as_operator, "happened")),
               threading.Thread(target=decide, args=("bob", bob, "abandon"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    decision = Intervention.objects.get(escalation=escalation)  # exactly one
    winner, loser = ("alice", "bob") if decision.decided_by == "alice" else ("bob", "alice")
    assert responses[winner]["Location"] == QUEUE  # the winner goes back to the queue
    assert responses[loser]["Location"] == page(escalation)  # the other is shown the escalation, decided
    shown = (as_operator if loser == "alice" else bob).get(page(escalation))
    assert f"already decided by {winner} at" in messages_of(shown)
    assert f"{winner} checked" in shown.content.decode()


def test_decisions_are_csrf_protected(operator: User):
    escalation = escalated("run-a")
    strict = logged_in(operator, enforce_csrf_checks=True)
    assert strict.post(page(escalation), {"outcome": "happened", "note": "n"}).status_code == 403
    assert not Intervention.objects.exists()


def test_the_queue_is_staff_only_and_read_only():
    escalation = escalated("run-a")
    outsider = logged_in(User.objects.create_user("carol", password="x-9f3-carol"))
    for url in (QUEUE, page(escalation)):
        assert outsider.get(url)["Location"].startswith("/admin/login/")
    decider = logged_in(staff("dora", "decide_escalation"))  # may decide, hence may look
    assert decider.get(QUEUE).status_code == 200
    assert decider.get(f"{QUEUE}add/").status_code == 403
    assert decider.post(f"{QUEUE}{escalation.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Escalation.objects.filter(pk=escalation.pk).exists()
    nobody = logged_in(staff("eve"))
    assert nobody.get(page(escalation)).status_code == 403


def test_cancelling_the_run_closes_its_escalation_and_a_late_decision_names_who(as_operator: Client):
    escalation = escalated("run-a")
    services.cancel_run("run-a", by="bob", note="customer withdrew")
    response = as_operator.get(page(escalation))
    assert response.context["form"] is None
    assert "customer withdrew" in response.content.decode()
    late = as_operator.post(page(escalation), {"outcome": "happened", "note": "found it"}, follow=True)
    assert "already decided by bob" in late.content.decode()
    assert Intervention.objects.get(escalation=escalation).action == "cancel"
    assert status("run-a") == RunStatus.CANCELLED


def test_an_escalation_that_does_not_exist_leads_back_to_the_queue(as_viewer: Client):
    response = as_viewer.get(f"{QUEUE}424242/change/", follow=True)
    assert response.redirect_chain == [(QUEUE, 302)]
    assert "There is no escalation #424242." in messages_of(response)
