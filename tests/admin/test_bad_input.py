"""A NUL character in what the back office is asked for (a filter, a search, a run id in the address) is refused
the way Django's admin refuses any lookup it cannot use, never a server error: PostgreSQL refuses NUL in text."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.admin.records import escalated

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/durableruns/runstate/"
ESCALATIONS = "/admin/durableruns/escalation/"
NUL = "\x00"


@pytest.mark.parametrize(("path", "params"), [
    (RUNS, {"plan": f"a{NUL}b"}),
    (RUNS, {"status__exact": f"pending{NUL}"}),
    (RUNS, {"workflow__exact": f"scripted{NUL}"}),
    (RUNS, {"q": "run", "plan": f"{NUL}"}),
], ids=["plan", "status", "workflow", "search and plan"])
def test_a_nul_in_a_list_filter_or_search_is_refused_as_an_invalid_lookup(as_viewer: Client, path, params):
    escalated("run-a")
    response = as_viewer.get(path, params)
    # Django's answer to a lookup it cannot use: back to the list with ?e=1, which says so.
    assert response.status_code == 302 and response["Location"] == f"{path}?e=1", response
    assert as_viewer.get(response["Location"]).status_code == 200


@pytest.mark.parametrize("path", [RUNS, ESCALATIONS])
def test_a_nul_in_a_search_is_dropped_as_djangos_search_form_drops_it(as_viewer: Client, path):
    escalated("run-a")
    escalated("run-b")
    response = as_viewer.get(path, {"q": f"run{NUL}a"})
    assert response.status_code == 200 and len(response.context["cl"].result_list) == 2  # the whole list


def test_the_same_lists_still_filter_and_search(as_viewer: Client):
    escalated("run-a")
    escalated("run-b")
    found = as_viewer.get(RUNS, {"q": "run-a", "status__exact": "needs_decision"})
    assert found.status_code == 200 and [r.run_id for r in found.context["cl"].result_list] == ["run-a"]
    queue = as_viewer.get(ESCALATIONS, {"q": "run-b"})
    assert queue.status_code == 200 and [e.run_id for e in queue.context["cl"].result_list] == ["run-b"]


@pytest.mark.parametrize("path", [f"{RUNS}run%00a/change/", f"{RUNS}run%00a/history/"])
def test_a_nul_in_a_runs_address_is_not_found(as_viewer: Client, path):
    escalated("run-a")
    response = as_viewer.get(path)
    # Django's admin answers an id it cannot find by sending staff back to the list with a message.
    assert response.status_code == 302 and response["Location"] == "/admin/", response
