"""A site with USE_TZ = False: refused at start-up by a system check, and the back office still readable.

durableruns compares instants (a lease's expiry, when a lagging lookup's "not found" proves absence) with the
database's timestamps. Under USE_TZ = False the claim's attempts (built as JSON by PostgreSQL, ISO text with an
offset) are aware while Django's clock is naive: resuming an in-doubt resolvable step raised TypeError on every
pass and the run stayed `running`, never worked. Naive local times also jump at daylight-saving changes, which
could prove a step absent an hour early. So the setting is refused by durableruns.E003 (cron's resume_runs
stops there, touching nothing), and the admin, which a site may still serve, renders naive times as local.
"""

from __future__ import annotations

import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client

from durableruns.models import Escalation, RunState, RunStatus
from project.purchasing.far import FarSystems
from tests.admin.records import escalated
from tests.conftest import ROOT, Workers
from tests.factories import complete, crash_after_intent, make_run

pytestmark = pytest.mark.django_db(transaction=True)


def use_tz_errors() -> list[checks.CheckMessage]:
    return [m for m in checks.run_checks() if m.id == "durableruns.E003"]


def test_the_check_refuses_use_tz_false_with_a_clear_message(settings):
    assert use_tz_errors() == []
    settings.USE_TZ = False
    [error] = use_tz_errors()
    assert error.level == checks.ERROR and error.msg == "durableruns needs USE_TZ = True"
    assert "naive local times" in error.hint and "daylight-saving" in error.hint and "run twice" in error.hint


@pytest.mark.postgres
def test_a_cron_pass_under_use_tz_false_stops_at_the_check_instead_of_crash_looping(
        tmp_path: Path, far: FarSystems, workers: Workers):
    """Today this pass exits 3 with a TypeError and leaves the run `running` under its lease, on every pass."""
    run_id = make_run("order", run_id="tz-1")
    complete(run_id, "prepare", {"total": 5, "lines": 60})
    crash_after_intent(run_id, "charge", cursor=1)  # a resolvable step in doubt: the pass must look it up
    (tmp_path / "naive_settings.py").write_text("from project.settings import *  # noqa: F403\n\nUSE_TZ = False\n")
    env = workers.env(DJANGO_SETTINGS_MODULE="naive_settings", PYTHONPATH=f"{tmp_path}:{ROOT}")
    done = subprocess.run([sys.executable, "manage.py", "resume_runs", "--lease", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # as cron runs it: with the checks
    assert done.returncode == 1, done.stdout + done.stderr
    assert "(durableruns.E003) durableruns needs USE_TZ = True" in done.stderr
    assert "Traceback" not in done.stderr and "TypeError" not in done.stderr
    run = RunState.objects.get(pk=run_id)
    assert (run.status, run.owner, run.epoch) == (RunStatus.RUNNING, "dead-worker", 1)  # nobody claimed it
    assert far.payments.count() == 0


def test_resume_runs_runs_the_durableruns_checks_before_it_claims_anything(settings):
    """The checks resume_runs runs at start (not every one of the site's: see the command) include E003."""
    run_id = make_run("scripted")
    settings.USE_TZ = False
    with pytest.raises(SystemCheckError, match=r"\(durableruns\.E003\) durableruns needs USE_TZ = True"):
        call_command("resume_runs", "--once", skip_checks=False, stdout=StringIO(), stderr=StringIO())
    settings.USE_TZ = True
    run = RunState.objects.get(pk=run_id)
    assert (run.status, run.epoch) == (RunStatus.PENDING, 0)  # nobody claimed it


def test_the_admin_pages_render_naive_times_as_the_sites_local_time(settings, as_operator: Client):
    escalation = escalated("run-a")
    settings.USE_TZ = False  # the database now hands out naive times, as it would to such a site
    pages = ["/admin/durableruns/runstate/", "/admin/durableruns/runstate/run-a/change/",
             "/admin/durableruns/escalation/", f"/admin/durableruns/escalation/{escalation.pk}/change/"]
    for url in pages:
        response = as_operator.get(url)
        assert response.status_code == 200, url
    opened = Escalation.objects.get(pk=escalation.pk).opened_at
    assert opened.tzinfo is None
    assert f"opened {opened:%Y-%m-%d %H:%M:%S}" in as_operator.get(pages[2]).content.decode()

