"""What a run holds, given back when it ends unfinished: real workers on PostgreSQL, the warehouse's own ledger.

The `holding` workflow (tests/workflows.py) acquires `lock` then `reserve` at the warehouse, then `pay` (which
the input can make fail) and `confirm` (which a person decides). Abandoned, cancelled or failed, a run releases
each acquisition once, the last acquired first; staff acts only mark the run, a worker releases.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.utils import timezone

import durableruns
from durableruns import services
from durableruns.errors import RunNotActionable
from durableruns.holdings import HoldState
from durableruns.models import Escalation, Intervention, Resolution, RunState, RunStatus, RunStep
from project.purchasing.far import FarSystems
from tests.conftest import Workers, wait_until
from tests.factories import make_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

FAST = {"TEST_LOOKUP_LAG": "0", "TEST_STEP_TIMEOUT": "0.2", "DURABLERUNS_RETRY_BACKOFF_SECONDS": "0"}
RELEASES = ("reserve:release", "lock:release")
ACTIVE = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING)


def work(workers: Workers, *args: str, **env: str) -> str:
    """Worker passes until no run is due, waiting (on the record) for a dead worker's lease or a wake time."""
    out = ""
    for _ in range(10):
        done = workers.run("--lease", "1", *args, **dict(FAST, **env))
        assert done.returncode == 0, done.stdout + done.stderr
        out += done.stdout
        active = RunState.objects.filter(status__in=ACTIVE)
        if not active.exists():
            return out
        wait_until(lambda: RunState.objects.due(timezone.now()).exists(), what=f"a due run: {list(active)}")
    raise AssertionError(f"runs still active after 10 passes:\n{out}")


def released_in_order(far: FarSystems, run_id: str) -> list[str]:
    """The run's releases at the warehouse, in the order the warehouse recorded them (by their keys)."""
    return [r["key"] for r in far.warehouse.releases() if r["key"].startswith(f"{run_id}:")]


def attempts(run_id: str, step: str) -> list[tuple[int, str, str]]:
    rows = RunStep.objects.filter(run_id=run_id, step=step).order_by("attempt")
    return list(rows.values_list("attempt", "status", "resolution"))


def holdings(run_id: str) -> dict[str, HoldState]:
    return {h.step: h.state for h in services.run_holdings(run_id)}


def test_a_failed_run_releases_each_acquisition_once_in_reverse_order(far: FarSystems, workers: Workers) -> None:
    run_id = make_run("holding", {"pay": "reject"})
    out = work(workers)
    run = RunState.objects.get(pk=run_id)
    assert (run.status, run.ending) == (RunStatus.FAILED, ""), out
    assert "pay" in run.reason
    assert released_in_order(far, run_id) == [f"{run_id}:reserve:release", f"{run_id}:lock:release"]
    assert far.warehouse.held() == []
    for release in RELEASES:
        assert attempts(run_id, release) == [(1, "completed", "returned")]
    assert holdings(run_id) == {"lock": HoldState.RELEASED, "reserve": HoldState.RELEASED}
    work(workers)  # nothing is due: a second pass gives back nothing twice
    assert len(far.warehouse.releases()) == 2


@pytest.mark.parametrize("how", ["abandon", "cancel"])
def test_staff_ending_a_run_leave_the_releases_to_a_worker(how: str, far: FarSystems, workers: Workers) -> None:
    run_id = make_run("holding", {"confirm": "boom"})
    work(workers)
    assert RunState.objects.get(pk=run_id).status == RunStatus.NEEDS_DECISION  # confirm escalated
    assert holdings(run_id) == {"lock": HoldState.HELD, "reserve": HoldState.HELD}
    if how == "abandon":
        durableruns.decide(run_id, "confirm", "abandon", by="alice", note="the buyer withdrew")
    else:
        services.cancel_run(run_id, by="alice", note="the buyer withdrew")
    run = RunState.objects.get(pk=run_id)
    # The web request only recorded the act: nothing was released inline, a worker will.
    assert (run.status, run.ending) == (RunStatus.PENDING, RunStatus.CANCELLED)
    assert far.warehouse.releases() == []
    # Already being cancelled: a second cancel (another member of staff, a second click) records nothing.
    acts = Intervention.objects.filter(run_id=run_id).count()
    with pytest.raises(RunNotActionable, match="already being cancelled"):
        services.cancel_run(run_id, by="bob", note="the buyer withdrew")
    assert Intervention.objects.filter(run_id=run_id).count() == acts
    work(workers)
    run = RunState.objects.get(pk=run_id)
    assert (run.status, run.ending) == (RunStatus.CANCELLED, "")
    assert "alice" in run.reason
    assert released_in_order(far, run_id) == [f"{run_id}:reserve:release", f"{run_id}:lock:release"]
    assert far.warehouse.held() == []
    work(workers)
    assert len(far.warehouse.releases()) == 2


def test_a_run_ending_with_nothing_held_ends_at_once(far: FarSystems, workers: Workers) -> None:
    run_id = make_run("holding", {"pay": "reject"})
    work(workers)
    services.cancel_run(run_id, by="alice", note="tidy up")  # failed and released already: nothing held
    assert RunState.objects.get(pk=run_id).status == RunStatus.CANCELLED
    assert len(far.warehouse.releases()) == 2


def test_a_completed_run_releases_nothing(far: FarSystems, workers: Workers) -> None:
    run_id = make_run("holding", {"confirm": "boom"})
    work(workers)
    durableruns.decide(run_id, "confirm", "happened", by="alice", note="confirmed by phone", result={})
    work(workers)
    assert RunState.objects.get(pk=run_id).status == RunStatus.COMPLETED
    assert far.warehouse.releases() == [] and len(far.warehouse.held()) == 2  # the order keeps its stock
    assert holdings(run_id) == {"lock": HoldState.KEPT, "reserve": HoldState.KEPT}
    assert services.run_holdings(run_id, held_only=True) == []


@pytest.mark.parametrize(("point", "found"), [("after_effect", True), ("after_intent", False)])
def test_an_acquisition_in_doubt_with_a_lookup_is_looked_up_first(point: str, found: bool, far: FarSystems,
                                                                   workers: Workers) -> None:
    run_id = make_run("holding")
    killed = workers.run("--worker", "doomed", "--lease", "1", DURABLERUNS_CRASH_AT=f"reserve@{point}", **FAST)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert holdings(run_id) == {"lock": HoldState.HELD, "reserve": HoldState.POSSIBLY_HELD}
    services.cancel_run(run_id, by="alice", note="stop it")
    assert RunState.objects.get(pk=run_id).ending == RunStatus.CANCELLED
    work(workers)
    assert RunState.objects.get(pk=run_id).status == RunStatus.CANCELLED
    if found:
        assert attempts(run_id, "reserve") == [(1, "completed", "lookup")]
        assert released_in_order(far, run_id) == [f"{run_id}:reserve:release", f"{run_id}:lock:release"]
    else:
        assert [(a, s) for a, s, _ in attempts(run_id, "reserve")] == [(1, "failed")]  # provably absent
        assert released_in_order(far, run_id) == [f"{run_id}:lock:release"]
        assert far.warehouse.find_reservation(f"{run_id}:reserve") is None  # not run again to be released
    assert far.warehouse.held() == []


def test_an_acquisition_in_doubt_without_a_lookup_is_listed_for_staff(far: FarSystems, workers: Workers) -> None:
    run_id = make_run("holding")
    killed = workers.run("--worker", "doomed", "--lease", "1", DURABLERUNS_CRASH_AT="lock@after_effect", **FAST)
    assert killed.returncode == -9
    services.cancel_run(run_id, by="alice", note="stop it")
    run = RunState.objects.get(pk=run_id)
    assert (run.status, run.ending) == (RunStatus.CANCELLED, "")  # nothing a worker can settle: ended at once
    assert far.warehouse.releases() == [] and len(far.warehouse.held()) == 1  # not released blindly
    listed = services.run_holdings(run_id, held_only=True)
    assert [(h.step, h.state) for h in listed] == [("lock", HoldState.POSSIBLY_HELD)]


def test_a_release_refused_every_attempt_is_escalated_and_staff_settle_it(far: FarSystems,
                                                                          workers: Workers) -> None:
    run_id = make_run("holding", {"pay": "reject", "lock:release:reject": 2})
    work(workers)
    run = RunState.objects.get(pk=run_id)
    assert (run.status, run.ending) == (RunStatus.NEEDS_DECISION, RunStatus.FAILED)
    escalation = Escalation.objects.open().get(run_id=run_id)
    assert (escalation.step, escalation.attempt) == ("lock:release", 2)
    assert [(a, s) for a, s, _ in attempts(run_id, "lock:release")] == [(1, "failed"), (2, "failed")]
    assert holdings(run_id) == {"lock": HoldState.HELD, "reserve": HoldState.RELEASED}  # not pretended gone
    durableruns.decide(run_id, "lock:release", "did_not_happen", by="alice", note="try again, it is back up")
    work(workers, **{"DURABLERUNS_RETRY_BACKOFF_SECONDS": "0"})
    run = RunState.objects.get(pk=run_id)
    assert (run.status, run.ending) == (RunStatus.FAILED, "")
    assert [(a, s) for a, s, _ in attempts(run_id, "lock:release")][-1] == (3, "completed")
    assert far.warehouse.held() == []


def test_staff_say_an_escalated_release_happened(far: FarSystems, workers: Workers, tmp_path: Path) -> None:
    run_id = make_run("holding", {"pay": "reject", "lock:release:reject": 9})
    work(workers)
    durableruns.decide(run_id, "lock:release", "happened", by="alice", note="released by hand in the WMS",
                       result={"by_hand": True})
    work(workers)
    run = RunState.objects.get(pk=run_id)
    assert run.status == RunStatus.FAILED
    assert attempts(run_id, "lock:release")[-1] == (3, "completed", Resolution.DECISION)
    assert holdings(run_id)["lock"] is HoldState.RELEASED


def test_staff_abandon_an_escalated_release_and_the_hold_stays_listed(far: FarSystems, workers: Workers) -> None:
    # reserve is released first (acquired last); its release is refused every time, so it is escalated
    run_id = make_run("holding", {"pay": "reject", "reserve:release:reject": 9})
    work(workers)
    escalation = Escalation.objects.open().get(run_id=run_id)
    assert escalation.step == "reserve:release"
    assert far.warehouse.releases() == []  # lock waits behind it: reverse order is kept
    durableruns.decide(run_id, "reserve:release", "abandon", by="alice", note="the warehouse will expire it")
    run = RunState.objects.get(pk=run_id)
    assert (run.status, run.ending) == (RunStatus.PENDING, RunStatus.FAILED)  # the other release still to do
    work(workers)
    run = RunState.objects.get(pk=run_id)
    assert (run.status, run.ending) == (RunStatus.FAILED, "")
    assert released_in_order(far, run_id) == [f"{run_id}:lock:release"]
    assert holdings(run_id) == {"lock": HoldState.RELEASED, "reserve": HoldState.HELD}  # not pretended gone
    assert [h.step for h in services.run_holdings(run_id, held_only=True)] == ["reserve"]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("point", ["before_intent", "after_intent", "after_effect", "after_return"])
def test_a_worker_killed_in_a_release_resumes_it_with_no_second_release(
    release: str, point: str, far: FarSystems, workers: Workers
) -> None:
    run_id = make_run("holding", {"pay": "reject"})
    killed = workers.run("--worker", "doomed", "--lease", "1", DURABLERUNS_CRASH_AT=f"{release}@{point}", **FAST)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert RunState.objects.get(pk=run_id).ending == RunStatus.FAILED  # the record says it is releasing
    work(workers)
    run = RunState.objects.get(pk=run_id)
    assert (run.status, run.ending) == (RunStatus.FAILED, ""), run.reason
    assert released_in_order(far, run_id) == [f"{run_id}:reserve:release", f"{run_id}:lock:release"]
    assert far.warehouse.held() == []
    rows = attempts(run_id, release)
    acted = point in ("after_effect", "after_return")
    if point == "before_intent":
        assert rows == [(1, "completed", "returned")]
    elif release == "reserve:release" and acted:  # resolvable: found by its key, not called again
        assert rows == [(1, "completed", "lookup")]
    else:  # re_executable (or provably not done): run again under the same key, which the warehouse honours
        assert [(a, s) for a, s, _ in rows] == [(1, "started"), (2, "completed")]
    keys = set(RunStep.objects.filter(run_id=run_id, step=release).values_list("effect_key", flat=True))
    assert keys == {f"{run_id}:{release}"}


def test_an_acquisition_whose_lookup_keeps_raising_while_the_run_ends_stops_for_staff(
    far: FarSystems, workers: Workers, tmp_path: Path
) -> None:
    run_id = make_run("holding")
    killed = workers.run("--worker", "doomed", "--lease", "1", DURABLERUNS_CRASH_AT="reserve@after_effect", **FAST)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    services.cancel_run(run_id, by="alice", note="stop it")
    unreachable = tmp_path / "warehouse-down"
    unreachable.write_text("not a directory")  # the warehouse's lookup raises
    wait_until(lambda: RunState.objects.due(timezone.now()).exists(), what="the dead worker's lease to run out")
    done = workers.run("--lease", "1", **dict(FAST, FAR_DIR=str(unreachable), DURABLERUNS_MAX_LOOKUP_ERRORS="1"))
    assert done.returncode == 0, done.stdout + done.stderr
    state = RunState.objects.get(pk=run_id)
    # Stopped for staff with the lookup's error; before, a run left waiting with no wake time, never taken again
    assert state.status == RunStatus.NEEDS_DECISION and state.ending == RunStatus.CANCELLED, state.reason
    assert state.reason.startswith("the lookup of reserve raised 1 times in a row")
    assert "FileExistsError" in state.reason
    assert holdings(run_id)["reserve"] == HoldState.POSSIBLY_HELD and far.warehouse.releases() == []
