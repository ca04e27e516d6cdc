"""Run attributes in the back office: the runs list's search box finds a run by an attribute's exact value (of
any name), the list shows each run's attributes compactly and the run page shows them whole; a run out of the
user's scope is found by none of them."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.test import Client

import durableruns
from durableruns import services
from tests.admin.users import VIEW, logged_in, staff
from tests.attribute_workflows import order_input

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/durableruns/runstate/"


def listed(client: Client, **query: str) -> list[str]:
    response = client.get(RUNS, query)
    assert response.status_code == 200
    return sorted(run.run_id for run in response.context["cl"].result_list)


@pytest.fixture
def orders() -> None:
    durableruns.start("attributed_order", order_input("PO-2026-0041", "Acme BV"), run_id="po-41")
    durableruns.start("attributed_order", order_input("PO-2026-0042", "Acme BV", lines=[]), run_id="po-42")
    durableruns.start("waiting", {"total": 10}, run_id="plain-PO-2026-0041")


def test_the_search_box_finds_a_run_by_an_attributes_exact_value(as_viewer: Client, orders) -> None:
    assert listed(as_viewer, q="PO-2026-0041") == ["po-41"]
    assert listed(as_viewer, q="Acme BV") == ["po-41", "po-42"]  # another name, the same box
    assert listed(as_viewer, q="0") == ["po-42"]  # an integer attribute (lines) by its decimal text
    assert listed(as_viewer, q="PO-2026") == []  # exact: no part of a value
    assert listed(as_viewer, q="po-4") == ["po-41", "po-42"]  # a run id's beginning, as before
    assert listed(as_viewer, q="x" * 300) == []  # longer than any value: no error, nothing found


def test_the_list_and_the_run_page_show_the_attributes(as_viewer: Client, orders) -> None:
    services.resume_due(run_id="po-41")
    html = as_viewer.get(RUNS).content.decode()
    assert "<strong>po</strong>=PO-2026-0041" in html and "<strong>buyer</strong>=Acme BV" in html
    assert "<strong>invoice</strong>=INV-1" in html
    page = as_viewer.get(f"{RUNS}po-41/change/").content.decode()
    assert "<strong>po</strong>=PO-2026-0041" in page and "<strong>carrier</strong>=DHL" in page
    assert "<strong>amount</strong>=99" in page
    plain = as_viewer.get(f"{RUNS}plain-PO-2026-0041/change/").content.decode()
    assert "<strong>po</strong>=" not in plain


def test_a_scoped_workflows_runs_are_not_found_by_their_attributes(settings, orders) -> None:
    settings.DURABLERUNS_WORKFLOW_GROUPS = {"attributed_order": ["Purchasing"]}
    outside = logged_in(staff("outside", *VIEW))
    member = staff("member", *VIEW)
    member.groups.add(Group.objects.create(name="Purchasing"))
    assert listed(outside, q="PO-2026-0041") == []
    assert listed(outside, q="Acme BV") == []
    assert listed(logged_in(member), q="PO-2026-0041") == ["po-41"]
