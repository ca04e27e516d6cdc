"""The back office's pages cost a fixed number of SQL queries: 10 runs or 1,000, a few attempts or hundreds.

Runs are written with bulk_create (seven steps done, notify_buyer in doubt, an open escalation each) so the
1,000-run case takes a second, not a minute of resume passes.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from durableruns.models import Escalation, RunStep
from tests.admin.records import bulk_purchases

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/durableruns/runstate/"
QUEUE = "/admin/durableruns/escalation/"


def queries(client: Client, url: str):
    """Count the queries of one GET of `url`, after a first GET has warmed per-process caches."""
    assert client.get(url).status_code == 200
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured), response


def test_the_runs_list_costs_the_same_for_10_and_1000_runs(as_operator: Client):
    bulk_purchases(10)
    few, response = queries(as_operator, RUNS)
    assert len(response.context["cl"].result_list) == 10
    bulk_purchases(990, start=10, retries=2)  # newer, so page one shows runs with 19 attempts each
    assert RunStep.objects.count() == 10 * 8 + 990 * 22
    many, response = queries(as_operator, RUNS)
    rows = list(response.context["cl"].result_list)
    assert len(rows) == 100 and response.context["cl"].result_count == 1000
    assert response.content.decode().count("7 steps complete, notify_buyer in doubt since") == 100
    print(f"\nruns list: {few} queries with 10 runs, {many} with 1,000")
    assert many == few


def test_a_run_page_costs_the_same_with_8_or_358_attempts_and_10_or_1000_runs(as_operator: Client):
    bulk_purchases(10)
    few, response = queries(as_operator, f"{RUNS}bulk-00000/change/")
    assert response.context["attempt_count"] == 8
    bulk_purchases(989, start=10)
    bulk_purchases(1, start=5000, retries=50)
    many, response = queries(as_operator, f"{RUNS}bulk-05000/change/")
    assert response.context["attempt_count"] == 7 * 51 + 1
    assert response.content.decode().count('class="dr-attempt') == 358
    print(f"\nrun page: {few} queries with 8 attempts, {many} with 358")
    assert many == few


def test_the_queue_costs_the_same_for_10_and_1000_escalations(as_operator: Client):
    bulk_purchases(10)
    few, response = queries(as_operator, QUEUE)
    assert len(response.context["cl"].result_list) == 10
    bulk_purchases(990, start=10, retries=2)
    assert Escalation.objects.open().count() == 1000
    many, response = queries(as_operator, QUEUE)
    assert len(response.context["cl"].result_list) == 50
    html = response.content.decode()
    assert html.count("22 attempts so far") + html.count("1 attempt so far") == 50
    assert html.count("<b>reserve_stock</b> held since") == 50  # what each run holds
    print(f"\nqueue: {few} queries with 10 escalations, {many} with 1,000")
    assert many == few


def test_an_escalation_page_costs_the_same_with_few_or_many_attempts(as_operator: Client):
    bulk_purchases(10)
    few_id = Escalation.objects.get(run_id="bulk-00000").pk
    few, _ = queries(as_operator, f"{QUEUE}{few_id}/change/")
    bulk_purchases(1, start=5000, retries=50)
    many_id = Escalation.objects.get(run_id="bulk-05000").pk
    many, response = queries(as_operator, f"{QUEUE}{many_id}/change/")
    assert len(response.context["holds"]) == 7
    print(f"\nescalation page: {few} queries with 8 attempts, {many} with 358")
    assert many == few
