"""The run page's progress and tracebacks, and the live JSON its script reads (issue 33)."""

from __future__ import annotations

import pytest

import tests.progress_workflows  # noqa: F401  (registers the workflows in this process)
from durableruns import services, store
from tests.admin.users import VIEW, logged_in, staff
from tests.factories import crash_after_intent, make_run

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/durableruns/runstate/"


def reporting_run() -> str:
    """A run whose crawl attempt is in hand (epoch 1) and has reported, through the store's fenced write."""
    run_id = make_run("progress_crawl")
    crash_after_intent(run_id, "crawl")
    lease = store.Lease(run_id=run_id, owner="dead-worker", epoch=1, seconds=30)
    store.record_progress(lease, step="crawl", attempt=1, message="crawled 3", done=3, total=5)
    return run_id


def test_the_run_page_shows_the_latest_progress_and_updates_it_live(as_viewer):
    run_id = reporting_run()
    page = as_viewer.get(f"{RUNS}{run_id}/change/").content.decode()
    assert "crawl: crawled 3 (3/5)" in page and 'id="dr-progress-bar" max="5" value="3"' in page
    assert 'data-active="1"' in page and f"{RUNS}{run_id}/live/" in page and "<script>" in page
    assert "{#" not in page and "small script asks" not in page  # the template's comment is not shown
    live = as_viewer.get(f"{RUNS}{run_id}/live/").json()
    assert live["active"] and live["progress"]["line"] == "crawl: crawled 3 (3/5)"
    assert [(a["step"], a["attempt"], a["status"]) for a in live["attempts"]] == [("crawl", 1, "started")]


def test_a_finished_runs_page_has_no_live_script():
    run_id = services.start_run("progressing", {})
    services.resume_due()
    page = logged_in(staff("viola", *VIEW)).get(f"{RUNS}{run_id}/change/").content.decode()
    assert "count: line 10 (10/10)" in page and 'data-active="0"' in page and "<script>" not in page


def test_the_live_state_is_for_those_who_see_the_run_and_in_scope(settings, as_viewer):
    run_id = reporting_run()
    nobody = logged_in(staff("nobody"))
    assert nobody.get(f"{RUNS}{run_id}/live/").status_code == 403
    settings.DURABLERUNS_WORKFLOW_GROUPS = {"progress_crawl": ["Crawlers"]}
    assert as_viewer.get(f"{RUNS}{run_id}/live/").status_code == 404  # out of scope: not there
    assert as_viewer.get(f"{RUNS}no-such-run/live/").status_code == 404


def test_the_traceback_is_shown_to_staff_with_view_runstate_only(as_viewer):
    run_id = services.start_run("progress_breaks", {})
    services.resume_due()
    page = as_viewer.get(f"{RUNS}{run_id}/change/").content.decode()
    assert "KeyError: &#x27;missing_key&#x27;" in page
    assert 'class="dr-traceback"' in page and "in lookup_missing" in page and "progress_workflows.py" in page
    # Staff who may cancel runs (and so open the page) without view_runstate see the error, not where it came from.
    canceller = logged_in(staff("carl", "cancel_run"))
    page = canceller.get(f"{RUNS}{run_id}/change/").content.decode()
    assert "KeyError: &#x27;missing_key&#x27;" in page and "in lookup_missing" not in page


def test_the_api_detail_includes_error_detail_for_staff_users_only():
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    run_id = services.start_run("progress_breaks", {})
    services.resume_due()
    seen = {}
    for user in (staff("viola", *VIEW), None):
        if user is None:
            user = staff("robot", *VIEW)
            user.is_staff = False
            user.save()
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
        [attempt] = client.get(f"/api/runs/{run_id}/").json()["attempts"]
        seen[user.is_staff] = attempt
    assert "in lookup_missing" in seen[True]["error_detail"]
    assert "error_detail" not in seen[False] and seen[False]["error"] == "KeyError: 'missing_key'"
