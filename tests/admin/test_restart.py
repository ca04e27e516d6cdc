"""Restart from a step in the back office: "restart from here" on each step of an ended run's page for staff
with durableruns.restart_run, a confirmation page with a required note, then the new run's page; both pages link
to each other; without the permission 403, out of scope 404, and nothing recorded."""

from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse

from durableruns import services
from durableruns.models import Intervention, RunState, RunStatus
from tests.admin.users import VIEW, logged_in, staff
from tests.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)


def page(run_id: str) -> str:
    return reverse("admin:durableruns_runstate_change", args=[quote(run_id)])


def restart(run_id: str, step: str) -> str:
    return reverse("admin:durableruns_runstate_restart", args=[step, quote(run_id)])


@pytest.fixture
def restarter():
    return logged_in(staff("rita", *VIEW, "restart_run"))


@pytest.fixture
def ended(far) -> str:
    run_id = make_run("order", run_id="po/41")  # a "/" in the id: the admin quotes it
    services.resume_due(run_id=run_id)
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    return run_id


def test_an_ended_runs_page_offers_restart_from_each_step_to_staff_with_the_permission(restarter, as_viewer, ended):
    html = restarter.get(page(ended)).content.decode()
    for step in ("prepare", "charge", "ship", "notify"):
        assert f'href="{restart(ended, step)}"' in html
    assert "restart from here" not in as_viewer.get(page(ended)).content.decode()


def test_an_unfinished_run_offers_no_restart(restarter, far):
    run_id = make_run("order", run_id="po-open")
    assert "restart from here" not in restarter.get(page(run_id)).content.decode()


def test_the_confirmation_asks_for_a_note_then_goes_to_the_new_run(restarter, ended):
    confirm = restarter.get(restart(ended, "charge"))
    assert confirm.status_code == 200 and "Yes, restart from charge" in confirm.content.decode()
    empty = restarter.post(restart(ended, "charge"), {"note": ""})
    assert empty.status_code == 200 and "A note saying why is required" in empty.content.decode()
    assert RunState.objects.count() == 1

    done = restarter.post(restart(ended, "charge"), {"note": "fix deployed"})
    new = RunState.objects.get(restarted_from=ended)
    assert done.status_code == 302 and done["Location"] == page(new.run_id)
    assert [a.note for a in Intervention.objects.filter(action="restart")] == ["fix deployed", "fix deployed"]
    # both pages link to each other
    assert f'href="{page(ended)}"' in restarter.get(page(new.run_id)).content.decode()
    assert f'href="{page(new.run_id)}"' in restarter.get(page(ended)).content.decode()


def test_a_refused_restart_says_why_and_records_nothing(restarter, far):
    run_id = make_run("order", run_id="po-open")
    response = restarter.post(restart(run_id, "charge"), {"note": "too early"}, follow=True)
    assert "was not restarted" in response.content.decode() and "pending" in response.content.decode()
    unknown = restarter.post(restart(run_id, "nope"), {"note": "x"}, follow=True)
    assert "nope" in unknown.content.decode()
    assert RunState.objects.count() == 1 and not Intervention.objects.exists()


def test_without_the_permission_403_and_out_of_scope_404(as_viewer, restarter, ended, settings):
    assert as_viewer.get(restart(ended, "charge")).status_code == 403
    assert as_viewer.post(restart(ended, "charge"), {"note": "n"}).status_code == 403
    settings.DURABLERUNS_WORKFLOW_GROUPS = {"order": ["Shipping"]}
    assert restarter.get(restart(ended, "charge")).status_code == 404
    assert restarter.post(restart(ended, "charge"), {"note": "n"}).status_code == 404
    assert RunState.objects.count() == 1 and not Intervention.objects.exists()
