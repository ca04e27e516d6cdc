"""What a run holds, shown while it waits: the run page, the queue (sorted and flagged by what lapses first),
the escalation page, the API's run detail and show_run. Purchase orders written as records: reserve_stock
completed (held at the warehouse for four hours), notify_buyer in doubt and escalated."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from durableruns.models import Escalation, RunState, RunStep
from tests.admin.records import bulk_purchases

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/durableruns/runstate/"
QUEUE = "/admin/durableruns/escalation/"


def acquired_ago(run_id: str, ago: timedelta) -> None:
    """Move the reservation's completion back in time, as if the run had waited that long since."""
    RunStep.objects.filter(run_id=run_id, step="reserve_stock").update(finished_at=timezone.now() - ago)


def test_the_queue_puts_the_hold_that_lapses_first_on_top_and_flags_it(as_operator: Client) -> None:
    fresh, lapsing, lapsed = bulk_purchases(3)  # escalations opened oldest last: bulk-00002 waits longest
    acquired_ago(lapsing, timedelta(hours=3, minutes=20))
    acquired_ago(lapsed, timedelta(hours=5))
    html = as_operator.get(QUEUE).content.decode()
    order = sorted((html.index(f"{run}/change/"), run) for run in (fresh, lapsing, lapsed))
    assert [run for _, run in order] == [lapsed, lapsing, fresh]
    assert "<b>reserve_stock</b> held since" in html
    assert "lapses in 39 min" in html or "lapses in 40 min" in html
    assert "lapsed 60 min ago" in html or "lapsed 1 h 0 min ago" in html
    assert html.count(">lapses soon<") == 1 and html.count(">lapsed<") == 1
    assert "lapses in 3 h 59 min" in html or "lapses in 4 h 0 min" in html  # the fresh one, not flagged


def test_without_holds_the_queue_keeps_the_longest_wait_on_top(as_operator: Client) -> None:
    runs = bulk_purchases(3)
    RunStep.objects.filter(step="reserve_stock").delete()  # nothing held by any of them
    html = as_operator.get(QUEUE).content.decode()
    order = sorted((html.index(f"{run}/change/"), run) for run in runs)
    assert [run for _, run in order] == list(reversed(runs))  # opened_at ascending
    assert html.count("nothing in another system") == 3


def test_the_run_page_and_the_escalation_page_show_the_holding(as_operator: Client) -> None:
    (run_id,) = bulk_purchases(1)
    html = as_operator.get(f"{RUNS}{run_id}/change/").content.decode()
    section = html[html.index('id="dr-holdings"'):html.index('id="dr-boundary"')]
    assert "<b>reserve_stock</b>" in section and "reserve_stock_0" in section and "lapses in" in section
    escalation = Escalation.objects.get(run_id=run_id)
    page = as_operator.get(f"{QUEUE}{escalation.pk}/change/").content.decode()
    assert '<ul class="dr-holds" id="dr-holdings"><li><b>reserve_stock</b> held since' in page


def test_the_api_run_detail_lists_what_the_run_holds(operator: object) -> None:
    (run_id,) = bulk_purchases(1)
    client = APIClient()
    client.force_authenticate(operator)
    body = client.get(f"/api/runs/{run_id}/").json()
    (holding,) = body["holdings"]
    finished = RunStep.objects.get(run_id=run_id, step="reserve_stock").finished_at
    assert holding["step"] == "reserve_stock" and holding["state"] == "held"
    assert holding["result"] == {"id": "reserve_stock_0", "total": 0}
    assert holding["release_step"] == "reserve_stock:release"
    since = holding["since"]
    assert since is not None and holding["expires_at"] is not None
    assert body["ending"] == ""
    RunStep.objects.create(run_id=run_id, step="reserve_stock:release", attempt=1, status="completed",
                           effect_key=f"{run_id}:reserve_stock:release", started_at=finished,
                           finished_at=finished, result={})
    assert client.get(f"/api/runs/{run_id}/").json()["holdings"] == []


def test_show_run_prints_the_holdings() -> None:
    (run_id,) = bulk_purchases(1)
    out = StringIO()
    call_command("show_run", run_id, stdout=out)
    text = out.getvalue()
    assert "holds:\n  reserve_stock        held" in text
    assert "lapses in" in text and '"id": "reserve_stock_0"' in text


def test_an_escalated_release_shows_its_own_policy_and_the_hold_still_held(as_operator: Client) -> None:
    (run_id,) = bulk_purchases(1, escalate=False)
    now = timezone.now()
    RunState.objects.filter(pk=run_id).update(ending="failed")
    for attempt in (1, 2, 3):
        RunStep.objects.create(run_id=run_id, step="reserve_stock:release", attempt=attempt, status="failed",
                               effect_key=f"{run_id}:reserve_stock:release", started_at=now, finished_at=now,
                               error="FarRejected: the warehouse refused")
    escalation = Escalation.objects.create(run_id=run_id, step="reserve_stock:release", attempt=3,
                                           effect_key=f"{run_id}:reserve_stock:release", in_doubt_since=now,
                                           opened_at=now, reason="reserve_stock:release failed 3 of 3 attempts")
    queue = as_operator.get(QUEUE).content.decode()
    assert "<b>reserve_stock</b> held since" in queue and "its release failed (3 attempts)" in queue
    page = as_operator.get(f"{QUEUE}{escalation.pk}/change/").content.decode()
    assert "re_executable" in page and "Give the stock back under the release" in page  # its own declaration
    runs = as_operator.get(RUNS).content.decode()
    assert "ending unfinished: gives back what it holds, then failed" in runs


def test_a_site_whose_workflows_declare_no_hold_expiry_still_orders_its_queue_by_pk_alone(monkeypatch) -> None:
    """With no hold lapse to compute, the queue's order is a NULL: selected by pk alone (as a bulk decision reads
    the queue's selection) it must still be a NULL PostgreSQL accepts in an ORDER BY."""
    from django.db.models import F

    from durableruns import reading, registry

    runs = bulk_purchases(2)
    expiring = {name for name, w in registry.workflows().items() if any(a.hold_expires_after for a in w.acquisitions())}
    assert expiring  # the suite's workflows do declare some: left out here
    monkeypatch.setattr(registry, "_registry", {n: w for n, w in registry._registry.items() if n not in expiring})
    queue = reading.with_hold_lapses(Escalation.objects.all()).order_by(F("hold_lapses_at").asc(nulls_last=True),
                                                                        "opened_at")
    assert list(queue.values_list("run_id", flat=True)) == list(reversed(runs))
