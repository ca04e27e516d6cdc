"""The admin's durableruns page opens on its dashboard: four server-drawn SVG charts whose bars link to the
filtered lists, in the same bounded number of queries with no runs and with 10,000."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from durableruns.clock import Clock
from durableruns.models import Escalation, RunState, RunStatus, RunStep
from tests.admin.users import VIEW, logged_in, staff
from tests.ops.records import aged_run, escalate

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/admin/durableruns/"
# The admin's own four (session, user, its permissions, its groups' permissions) and the dashboard's six.
MAX_QUERIES = 10


def bulk(
    count: int,
    status: str,
    *,
    prefix: str,
    finished_ago: str = "1 hour",
    created_ago: str = "2 hours",
    workflow: str = "scripted",
) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, "
            "lease_expires_at, wake_at, reason, input, created_at, updated_at) "
            f"SELECT %s || g, %s, 'f', %s, 0, '', 0, NULL, NULL, '', '{{}}'::jsonb, now() - interval '{created_ago}', "
            f"now() - interval '{finished_ago}' FROM generate_series(1, %s) g",
            [prefix, workflow, status, count],
        )


def bars(html: str, chart: str) -> dict[str, tuple[int, str]]:
    """label -> (value, link) of the bars of one chart, read back from the SVG."""
    section = html.split(f'id="dr-chart-{chart}"', 1)[1].split("</section>", 1)[0]
    found = re.findall(r'<a href="([^"]+)" aria-label="([^"]+): (\d+)">', section)
    return {label: (int(value), href.replace("&amp;", "&")) for href, label, value in found}


def test_it_renders_with_no_runs_in_a_bounded_number_of_queries(django_assert_max_num_queries):
    client = logged_in(staff("viola", *VIEW))
    with django_assert_max_num_queries(MAX_QUERIES):
        response = client.get(URL)
    assert response.status_code == 200
    html = response.content.decode()
    board = html.split('id="durableruns-dashboard"')[1].split("</div>")[0]
    assert (
        board.count("<svg") == 4
        and "<script" not in board
        and "http" not in board.replace('xmlns="http://www.w3.org/2000/svg"', "")
    )
    status = bars(html, "status")
    assert status["completed"] == (0, "/admin/durableruns/runstate/?status__exact=completed")
    assert set(status) == set(RunStatus.labels)
    assert bars(html, "in_doubt") == {}
    assert "none" in html.split('id="dr-chart-in_doubt"')[1].split("</section>")[0]
    assert 'href="/admin/durableruns/runstate/"' in html  # the app's usual page list is still there


def test_it_renders_10000_runs_in_the_same_bound_with_their_numbers(django_assert_max_num_queries):
    bulk(6000, "completed", prefix="done-", finished_ago="90 minutes", created_ago="3 hours")
    bulk(1500, "completed", prefix="old-", finished_ago="3 days", created_ago="3 days")
    bulk(1200, "failed", prefix="failed-")
    bulk(800, "pending", prefix="pending-")
    bulk(400, "cancelled", prefix="cancelled-")
    bulk(97, "waiting", prefix="waiting-", workflow="order")
    now = Clock().now()
    for index, hours in enumerate((0.5, 2, 10, 30, 100)):  # one escalation in each age bucket, plus one decided
        run = aged_run(RunStatus.NEEDS_DECISION, attempts=0)
        escalate(run, opened_ago=timedelta(hours=hours))
        RunStep.objects.create(
            run_id=run,
            step="second",
            attempt=1,
            status="started",
            effect_key=f"k{index}",
            started_at=now - timedelta(hours=hours),
            owner="w",
            epoch=1,
        )
    escalate(aged_run(RunStatus.PENDING, attempts=0), decided=True, opened_ago=timedelta(days=9))
    assert RunState.objects.count() == 10_003
    client = logged_in(staff("viola", *VIEW))
    with django_assert_max_num_queries(MAX_QUERIES):
        response = client.get(URL)
    html = response.content.decode()
    status = bars(html, "status")
    assert status["completed"][0] == 7500 and status["failed"][0] == 1200
    assert status["pending"][0] == 801 and status["needs decision"][0] == 5 and status["waiting"][0] == 97
    assert "10,003 in all" in html
    ages = bars(html, "escalations")
    assert [value for value, _ in ages.values()] == [1, 1, 1, 1, 1]
    assert {link for _, link in ages.values()} == {"/admin/durableruns/escalation/?state=open"}
    per_hour = bars(html, "throughput")
    assert len(per_hour) == 24 and sum(v for v, _ in per_hour.values()) == 6000
    assert sorted(v for v, _ in per_hour.values())[-1] == 6000  # all in the hour 90 minutes ago
    assert bars(html, "in_doubt") == {"scripted": (5, "/admin/durableruns/runstate/?workflow__exact=scripted")}


def test_every_link_opens_its_filtered_list():
    bulk(3, "failed", prefix="f-")
    run = aged_run(RunStatus.NEEDS_DECISION, attempts=0)
    escalate(run, opened_ago=timedelta(hours=2))
    RunStep.objects.create(
        run_id=run,
        step="second",
        attempt=1,
        status="started",
        effect_key="k",
        started_at=Clock().now(),
        owner="w",
        epoch=1,
    )
    client = logged_in(staff("viola", *VIEW))
    html = client.get(URL).content.decode()
    failed_list = client.get(bars(html, "status")["failed"][1])
    assert failed_list.status_code == 200 and b"f-1" in failed_list.content and run.encode() not in failed_list.content
    queue = client.get(bars(html, "escalations")["1 to 4 hours"][1])
    assert queue.status_code == 200 and run.encode() in queue.content
    workflow_list = client.get(bars(html, "in_doubt")["scripted"][1])
    assert workflow_list.status_code == 200 and run.encode() in workflow_list.content


def test_staff_the_runs_list_does_not_admit_see_no_dashboard():
    client = logged_in(staff("eve", "view_escalation"))
    response = client.get(URL)
    assert response.status_code == 200
    assert b"durableruns-dashboard" not in response.content
    assert Escalation.objects.count() == 0
