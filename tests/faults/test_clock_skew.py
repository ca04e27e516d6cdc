"""Workers on hosts whose clocks are wrong: the database's clock is the only one that decides.

Each skewed worker is a real `resume_runs` process under libfaketime (Debian's faketime, installed by
`bin/setup --services`; tests.conftest.Workers.skewed), so its wall clock (time.time, datetime.now, Django's
timezone.now) is off by a fixed amount while its monotonic clock stays true. The far systems the workers call
keep their own true clock (tests.workflows.far_clock): skewing a caller does not move a far system's lag.

* A live worker inside a slow escalate step, beside workers 120 s ahead and 120 s behind: neither takes the run
  from it, and the run completes with one email.
* A worker killed right after a credit check whose lookup lags 10 s, resumed by a worker 30 s ahead: the
  resumer does not trust "not found" before the lag has passed since the attempt's last renewal, so it never
  calls the vendor a second time.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from durableruns import services
from durableruns.models import Escalation, RunState, RunStep
from project.purchasing.far import FarSystems
from tests.conftest import ROOT, Workers, wait_until
from tests.faults.support import ACTIVE, spawn
from tests.logs import stray_tracebacks

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

LEASE = "2"  # seconds: renewed every 2/3 s, so a few renewals pass while the skewed workers look on
# The child's wall and monotonic clocks, and how long a sleep and a thread's timed wait last on its monotonic clock.
CLOCK = (
    "import json, threading, time\n"
    "wall, mono = time.time(), time.monotonic()\n"
    "time.sleep(0.2); slept = time.monotonic() - mono\n"
    "threading.Event().wait(0.2); waited = time.monotonic() - mono - slept\n"
    "print(json.dumps([wall, mono, slept, waited]))\n"
)


@pytest.mark.parametrize("offset, seconds", [("+120s", 120.0), ("-120s", -120.0), ("+30s", 30.0)])
def test_a_skewed_process_sees_its_wall_clock_shifted_and_its_monotonic_clock_true(offset, seconds):
    env = Workers().env(**Workers.skewed(offset))
    wall_before, mono_before = time.time(), time.monotonic()
    done = subprocess.run([sys.executable, "-c", CLOCK], env=env, capture_output=True, text=True, timeout=30)
    wall_after, mono_after = time.time(), time.monotonic()
    assert done.returncode == 0, done.stderr
    wall, mono, slept, waited = json.loads(done.stdout)
    assert wall_before + seconds - 0.5 <= wall <= wall_after + seconds + 0.5, (wall - wall_before, offset)
    assert mono_before <= mono <= mono_after  # durations inside one process stay right
    assert slept >= 0.2 and waited >= 0.2, (slept, waited)  # sleeps and timed waits last what they should


def test_a_skewed_worker_process_runs_django_on_the_skewed_clock():
    env = Workers().env(**Workers.skewed("+120s"))
    before = time.time()
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c",
         "from django.utils import timezone; from tests.workflows import far_clock; "
         "print(timezone.now().timestamp(), far_clock())"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    after = time.time()
    assert done.returncode == 0, done.stderr
    django_now, far_now = map(float, done.stdout.strip().splitlines()[-1].split())
    assert before + 119.5 <= django_now <= after + 120.5
    assert before - 0.5 <= far_now <= after + 0.5  # the far systems' clock is not the worker's


def test_workers_ahead_and_behind_do_not_take_a_run_from_its_live_worker(
    workers: Workers, far: FarSystems, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    run_id = services.start_run("slow_notice", {"release_file": str(release)}, run_id="skew-notice")
    live = spawn(workers, tmp_path / "out", "live", "--run", run_id, "--lease", LEASE)
    wait_until(lambda: far.email.count() == 1, timeout=30, what="the live worker's email")
    claimed = RunState.objects.get(pk=run_id)
    assert claimed.status == "running" and claimed.owner.startswith("live#"), claimed.owner  # live's thread

    others = [spawn(workers, tmp_path / "out", name, "--loop", "--interval", "0.2", "--lease", LEASE, "-v", "2",
                    **Workers.skewed(offset)) for name, offset in (("ahead", "+120s"), ("behind", "-120s"))]
    for other in others:  # each has made at least one pass (-v 2 prints every pass) before the watch begins
        wait_until(lambda: other.out.stat().st_size > 0 or other.proc.poll() is not None, timeout=30,
                   what=f"{other.out.stem}'s first pass")

    # Watch the live worker renew its lease three times while the skewed workers pass again and again.
    renewals: set[object] = set()

    def renewed_three_times_or_taken() -> bool:
        state = RunState.objects.get(pk=run_id)
        if state.epoch != claimed.epoch or state.owner != claimed.owner:
            return True
        renewals.add(state.lease_expires_at)
        return len(renewals) > 3

    wait_until(renewed_three_times_or_taken, timeout=30, what="three renewals of the live worker's lease")
    state = RunState.objects.get(pk=run_id)
    assert (state.owner, state.epoch) == (claimed.owner, claimed.epoch), (
        f"a worker with a skewed clock took the run from its live owner: now {state.owner} at epoch {state.epoch}, "
        f"status {state.status}: {state.reason}")

    release.touch()
    live.proc.wait(timeout=30)
    wait_until(lambda: RunState.objects.get(pk=run_id).status not in ACTIVE, timeout=30, what="the run to end")
    for other in others:
        other.proc.send_signal(signal.SIGTERM)
    for other in others:
        other.proc.wait(timeout=30)

    state = RunState.objects.get(pk=run_id)
    out, err = live.output()
    assert state.status == "completed", (state.status, state.reason, out, err)
    assert (state.owner, state.epoch) == (claimed.owner, claimed.epoch)
    assert live.proc.returncode == 0 and f"{run_id}: completed" in out, (live.proc.returncode, out, err)
    assert far.email.count() == 1
    assert not Escalation.objects.filter(run_id=run_id).exists()  # nobody is asked about an email that was sent
    for other in others:
        o_out, o_err = other.output()
        assert other.proc.returncode == 0 and not stray_tracebacks(o_err), (o_out, o_err)
        assert run_id not in o_out, o_out  # it never worked the run


def test_a_resume_30s_ahead_waits_out_a_lagging_lookup_and_never_calls_the_far_system_again(
    workers: Workers, far: FarSystems, tmp_path: Path
) -> None:
    run_id = services.start_run("lagging_credit", {}, run_id="skew-credit")
    key = f"{run_id}:check_credit"
    lag = {"FAR_CREDIT_LOOKUP_LAG": "10", "DURABLERUNS_LOOKUP_RETRY_SECONDS": "0.5"}
    killed = workers.start("--run", run_id, "--lease", LEASE, DURABLERUNS_CRASH_AT="check_credit@after_effect", **lag)
    out, err = killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, out, err)
    assert far.credit.counts_by_key() == {key: 1}

    resumer = spawn(workers, tmp_path / "out", "ahead", "--loop", "--interval", "0.2", "--lease", LEASE, "-v", "2",
                    **lag, **Workers.skewed("+30s"))
    wait_until(lambda: RunState.objects.get(pk=run_id).status not in ACTIVE or far.credit.count() > 1,
               timeout=40, every=0.1, what="the run to settle")
    resumer.proc.send_signal(signal.SIGTERM)
    resumer.proc.wait(timeout=30)
    out, err = resumer.output()

    effects = far.credit.effects(key)
    assert len(effects) == 1, (
        f"the resumer trusted the lagging lookup's 'not found' and checked credit again "
        f"{effects[-1]['created_at'] - effects[0]['created_at']:.1f} s after the first check (lag 10 s): {out}")
    state = RunState.objects.get(pk=run_id)
    assert state.status == "completed", (state.status, state.reason, out, err)
    settled = RunStep.objects.get(run_id=run_id, step="check_credit", status="completed")
    assert settled.resolution == "lookup" and settled.result is not None
    assert settled.result["check_id"] == f"cc_{effects[0]['id']}"
    assert resumer.proc.returncode == 0 and not stray_tracebacks(err), (out, err)
