"""The process's heartbeat: one thread for every pass, renewing only the runs in hand, holding no connection
between renewals."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

import durableruns
from durableruns import services
from durableruns.heartbeat import RENEWER
from durableruns.models import RunState
from tests.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)


def heartbeat_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "durableruns-heartbeat"]


def test_one_thread_renews_for_every_pass_and_only_the_runs_in_hand():
    seen = []
    for _ in range(3):
        run_id = make_run()
        report = services.resume_due(limit=1)
        assert report.counts() == {"completed": 1}, report.summary()
        assert RunState.objects.get(pk=run_id).status == "completed"
        seen.append([t.ident for t in heartbeat_threads()])
    assert len(seen[0]) == 1 and seen == [seen[0]] * 3  # the same thread, started once
    assert RENEWER.holding() == []  # a pass that ended renews nothing


def test_the_lease_in_hand_is_renewed_while_the_step_runs_and_not_after():
    wf = durableruns.Workflow("heartbeat_probe")
    seen = {}

    @wf.step(policy="re_executable")
    def wait(ctx):
        seen["held"] = [lease.run_id for lease in RENEWER.holding()]
        before = RunState.objects.get(pk=ctx.run_id).lease_expires_at
        time.sleep(0.5)  # renewals every 0.1 s
        seen["extended"] = RunState.objects.get(pk=ctx.run_id).lease_expires_at > before
        return {}

    run_id = make_run("heartbeat_probe")
    assert services.resume_due(lease_seconds=0.3).counts() == {"completed": 1}
    assert seen == {"held": [run_id], "extended": True}
    assert RENEWER.holding() == []


@pytest.mark.skipif(connection.vendor != "postgresql", reason="counts server connections")
def test_the_heartbeat_holds_no_connection_between_renewals():
    wf = durableruns.Workflow("heartbeat_connections")
    seen = {}

    def other_backends() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND pid <> pg_backend_pid()")
            return int(cursor.fetchone()[0])

    @wf.step(policy="re_executable")
    def long(ctx):
        before = RunState.objects.get(pk=ctx.run_id).lease_expires_at
        time.sleep(0.8)  # a renewal at 0.5 s, whose connection is closed again by now
        seen["renewed"] = RunState.objects.get(pk=ctx.run_id).lease_expires_at > before
        seen["other_connections"] = other_backends()
        return {}

    make_run("heartbeat_connections")
    assert services.resume_due(lease_seconds=1.5).counts() == {"completed": 1}
    assert seen == {"renewed": True, "other_connections": 0}
