"""Real worker processes on PostgreSQL: racing, paused past the lease, and killed between the two commits."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest

import durableruns
from durableruns.models import Escalation, Resolution, RunState, RunStatus, RunStep, StepStatus
from tests.conftest import wait_until
from tests.factories import make_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

FAST = {"TEST_LOOKUP_LAG": "0.3", "TEST_STEP_TIMEOUT": "0.2", "DURABLERUNS_RETRY_BACKOFF_SECONDS": "0"}


def statuses() -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in RunState.objects.values_list("status", flat=True):
        counts[s] = counts.get(s, 0) + 1
    return counts


def test_two_workers_racing_never_execute_a_step_twice(far, workers):
    run_ids = [make_run("order") for _ in range(30)]
    procs = [workers.start("--limit", "100", "--worker", name, **FAST) for name in ("w1", "w2")]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert statuses() == {"completed": 30}
    # one attempt per step per run, and one effect per key at every far system
    assert RunStep.objects.count() == 30 * 4
    assert set(RunStep.objects.values_list("attempt", flat=True)) == {1}
    assert far.payments.count() == 30 and far.carrier.count() == 30 and far.carrier.duplicates() == {}
    assert far.email.count() == 30 * 61
    owners = {owner.split("#")[0] for owner in  # host:pid#thread: the process's name, then its thread's
              RunState.objects.filter(pk__in=run_ids).values_list("owner", flat=True)}
    assert owners <= {"w1", "w2"}


@pytest.mark.parametrize("concurrency", ["1", "8"])
def test_a_worker_paused_past_its_lease_has_its_writes_refused(far, workers, tmp_path, concurrency):
    run_id = make_run("order")
    mark = tmp_path / "at-line-15"
    paused = workers.start("--lease", "1", "--worker", "paused", "--concurrency", concurrency,
                           TEST_MARK_AT_LINE_15=str(mark), **FAST)
    wait_until(mark.exists, what="the worker to reach line 15 of prepare")
    paused.send_signal(signal.SIGSTOP)
    time.sleep(1.5)  # past the lease; its heartbeat is frozen too
    taker = workers.run("--lease", "30", "--worker", "taker", **FAST)
    assert taker.returncode == 0, taker.stderr
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    paused.send_signal(signal.SIGCONT)
    out, err = paused.communicate(timeout=60)
    assert "fenced_out" in out, out + err
    first = RunStep.objects.get(run_id=run_id, step="prepare", attempt=1)
    assert (first.status, first.owner.split("#")[0]) == (StepStatus.STARTED, "paused")  # never completed by it
    assert {owner.split("#")[0] for owner in RunStep.objects.filter(status="completed").values_list(
        "owner", flat=True)} == {"taker"}
    run = RunState.objects.get(pk=run_id)
    assert (run.owner.split("#")[0], run.status) == ("taker", RunStatus.COMPLETED)
    assert far.payments.count() == 1 and far.carrier.count() == 1


def kill_then_resume(workers, crash_at, tmp_path, **extra):
    extra = dict(FAST, **extra)
    crashed = workers.run("--lease", "0.5", **extra, DURABLERUNS_CRASH_AT=crash_at,
                          DURABLERUNS_CRASH_MARKER=str(tmp_path / "crashed"))
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    time.sleep(0.6)  # the dead worker's lease runs out
    resumed = workers.run("--lease", "0.5", **extra)
    assert resumed.returncode == 0, resumed.stderr
    return resumed


def test_killed_re_executable_step_runs_again_from_its_last_checkpoint(far, workers, tmp_path):
    run_id = make_run("order")
    # killed after line 35 was priced: the last checkpoint is at 30
    kill_then_resume(workers, "prepare@loop:35", tmp_path)
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    rows = list(RunStep.objects.filter(run_id=run_id, step="prepare").order_by("attempt"))
    assert [(r.attempt, r.status) for r in rows] == [(1, "started"), (2, "completed")]
    assert rows[0].loop_cursor == 30
    line_mails = far.email.count() - 1  # minus the notify email
    assert line_mails == 35 + (60 - 30)  # lines 30..34 redone: 5 <= every=10
    assert rows[1].result == {"total": sum(range(60)), "lines": 60}


@pytest.mark.parametrize("point", ["before_intent", "after_intent"])
def test_killed_around_the_first_intent_which_rides_on_the_claim(far, workers, tmp_path, point):
    run_id = make_run("order")
    crashed_epochs = []
    if point == "before_intent":  # before the claim's commit: the run was never taken
        kill_then_resume(workers, "prepare@before_intent", tmp_path)
    else:
        crashed = workers.run("--lease", "0.5", **FAST, DURABLERUNS_CRASH_AT="prepare@after_intent")
        assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
        crashed_epochs = list(RunStep.objects.filter(run_id=run_id).values_list("step", "attempt", "status", "epoch"))
        time.sleep(0.6)
        assert workers.run("--lease", "0.5", **FAST).returncode == 0
    run = RunState.objects.get(pk=run_id)
    prepare = list(RunStep.objects.filter(run_id=run_id, step="prepare").order_by("attempt")
                   .values_list("attempt", "status"))
    assert run.status == RunStatus.COMPLETED
    if point == "before_intent":
        assert run.epoch == 1 and prepare == [(1, "completed")]  # claimed once: the killed claim left nothing
        assert far.email.count() == 60 + 1  # every line priced once, and the notify email
    else:
        assert crashed_epochs == [("prepare", 1, "started", 1)]  # the intent was committed with the claim
        assert run.epoch == 2 and prepare == [(1, "started"), (2, "completed")]  # re_executable: ran again
        assert far.email.count() == 60 + 1  # killed before pricing a line


@pytest.mark.parametrize("point", ["after_intent", "after_effect"])
def test_killed_resolvable_step_settles_by_lookup_with_one_effect(far, workers, tmp_path, point):
    run_id = make_run("order")
    lag = {"TEST_LOOKUP_LAG": "3"}  # long enough that a loaded machine's slow worker start-up stays inside it
    kill_then_resume(workers, f"ship@{point}", tmp_path, **lag)
    run = RunState.objects.get(pk=run_id)
    if point == "after_intent":
        # nothing reached the carrier: not found, and not trusted until the dead worker's lease (0.5 s from its
        # intent, or from its last renewal), its timeout and the lag have passed
        ship = RunStep.objects.get(run_id=run_id, step="ship", attempt=1)
        assert run.status == RunStatus.WAITING
        assert ship.held_until >= ship.started_at + timedelta(seconds=0.5)
        assert abs((run.wake_at - ship.held_until).total_seconds() - 3.2) < 0.01
        assert far.carrier.count() == 0
        wait_until(lambda: workers.run(**dict(FAST, **lag)).returncode == 0
                   and RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED, timeout=15,
                   every=0.2, what="the carrier step to run again once absence is provable")
    ship = list(RunStep.objects.filter(run_id=run_id, step="ship").order_by("attempt"))
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    assert far.carrier.count() == 1 and far.carrier.duplicates() == {}  # the carrier does not dedupe: we did
    if point == "after_effect":
        assert [(s.attempt, s.status, s.resolution) for s in ship] == [(1, "completed", Resolution.LOOKUP)]
        assert ship[0].result == far.carrier.lookup(f"{run_id}:ship")
    else:
        assert [(s.attempt, s.status) for s in ship] == [(1, "started"), (2, "completed")]
        assert ship[1].effect_key == ship[0].effect_key


def test_killed_escalate_step_waits_for_a_person_then_runs_once(far, workers, tmp_path):
    run_id = make_run("order")
    kill_then_resume(workers, "notify@after_intent", tmp_path)
    assert RunState.objects.get(pk=run_id).status == RunStatus.NEEDS_DECISION
    escalation = Escalation.objects.open().get()
    assert (escalation.step, escalation.attempt) == ("notify", 1)
    notify_mails = lambda: len([e for e in far.email.effects() if e["payload"]["subject"].endswith(":shipped")])  # noqa: E731
    assert notify_mails() == 0
    assert workers.run(**FAST).stdout.count(run_id) == 0  # not claimable while undecided
    durableruns.decide(run_id, "notify", "did_not_happen", by="alice", note="outbox is empty")
    assert workers.run(**FAST).returncode == 0
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    assert notify_mails() == 1
    assert far.payments.count() == 1 and far.carrier.count() == 1
