"""A limited run cancelled while its worker is inside a far call (issue 30): the limit means no overlap at the far
system, so the cancelled run holds its slot until its worker, fenced out, lets go, or the lease it had runs out.
In process on PostgreSQL and SQLite (the claim itself), and with real worker processes on PostgreSQL."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

import durableruns
from durableruns import services, store
from durableruns.limits import PARKED
from durableruns.models import RunState, RunStatus
from tests.conftest import CITUS_LANE, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def claim(owner: str, lease_seconds: float = 30):
    return store.claim(owner=owner, lease_seconds=lease_seconds)


def test_a_cancelled_run_holds_its_slot_until_its_worker_lets_go():
    first, second = (durableruns.start("gated", {"account": "k"}) for _ in range(2))
    held = claim("w1")
    assert held.lease.run_id == first and claim("w2") is None
    services.cancel_run(first, by="ops", note="ordered twice")
    assert RunState.objects.get(pk=first).status == RunStatus.CANCELLED
    # Its worker may still be inside the far call: the key's one slot is still its.
    assert claim("w3") is None
    assert RunState.objects.get(pk=second).status != RunStatus.RUNNING
    assert not store.let_go(store.Lease(run_id=first, owner="someone-else", epoch=held.lease.epoch, seconds=30))
    assert claim("w4") is None
    # Fenced out, its worker lets go: the slot is free, and the second run is taken.
    assert store.let_go(held.lease)
    assert not store.let_go(held.lease)  # once
    taken = claim("w5")
    assert taken is not None and taken.lease.run_id == second


def test_a_cancelled_run_holds_its_slot_until_the_lease_it_had_runs_out():
    first, second = (durableruns.start("gated", {"account": "k"}) for _ in range(2))
    held = claim("w1", lease_seconds=1)
    services.cancel_run(first, by="ops", note="ordered twice")
    assert claim("w2") is None
    until = RunState.objects.get(pk=first).lease_expires_at
    if RunState.objects.get(pk=second).reason == PARKED:  # PostgreSQL parks it, to wake when that lease ends
        assert RunState.objects.get(pk=second).wake_at == until
    # (nobody lets go: its worker died inside the call)
    wait_until(lambda: store.DATABASE.now() > until, timeout=10, what="the cancelled run's lease to run out")
    taken = claim("w3")
    assert taken is not None and taken.lease.run_id == second
    assert held.lease.run_id == first


def test_a_run_of_another_key_is_not_held_back_by_a_cancelled_run():
    first = durableruns.start("gated", {"account": "k"})
    other = durableruns.start("gated", {"account": "other"})
    assert claim("w1").lease.run_id == first
    services.cancel_run(first, by="ops", note="ordered twice")
    assert claim("w2").lease.run_id == other


# -- real worker processes (PostgreSQL) ------------------------------------------------------------------------


def _log(folder: Path) -> dict[tuple[str, str], float]:
    path = folder / "log"
    lines = path.read_text().splitlines() if path.exists() else []
    return {(run, what): float(at) for run, what, at in (line.split() for line in lines)}


@pytest.mark.postgres
@pytest.mark.skipif(
    CITUS_LANE,
    reason="it follows the second run's parking, which a Citus-distributed record does not do (its claim walks past "
    "a run whose key is full); the in-process tests above hold the slot there",
)
@pytest.mark.parametrize("its_worker", ["returns", "is_killed"])
def test_two_runs_of_a_key_never_overlap_at_the_far_system_across_a_cancel(workers, tmp_path, its_worker):
    """A run of key K (limit 1) is inside a slow far call when staff cancel it; a second run of K is due. The
    second enters the far system only after the first's worker has left it (its call returned, its fenced write
    failed, it let go) or, killed inside it, after the lease it held ran out; never while the first is there."""
    env = {"GATED_DIR": str(tmp_path)}
    first = durableruns.start("gated", {"account": "k"})
    lease = "20" if its_worker == "returns" else "3"  # returns: long enough to outlast the test's looks
    doomed = workers.start("--loop", "--lease", lease, "--interval", "0.2", "--worker", "w1", **env)
    wait_until(lambda: (first, "entered") in _log(tmp_path), timeout=60, what="the first run to enter the far call")
    second = durableruns.start("gated", {"account": "k"})
    (tmp_path / f"open-{second}").touch()  # the second's call returns at once, whenever it is made
    workers.start("--loop", "--lease", "3", "--interval", "0.2", "--worker", "w2", **env)
    wait_until(
        lambda: RunState.objects.filter(pk=second, reason=PARKED).exists(),
        timeout=60,
        what="the second run to be held back by the limit",
    )

    services.cancel_run(first, by="ops", note="ordered twice")
    held_until = RunState.objects.get(pk=first).lease_expires_at
    # The cancel lets the parked run go; a worker claims it, and the claim refuses it again, now with a wake time
    # (the first's lease end), or (the bug) takes it into the far call beside the first.
    wait_until(
        lambda: (
            (second, "entered") in _log(tmp_path)
            or RunState.objects.filter(pk=second, reason=PARKED, wake_at__isnull=False).exists()
        ),
        timeout=60,
        what="a worker to look at the second run after the cancel",
    )
    assert (second, "entered") not in _log(tmp_path), "the second run entered the far call beside the first"
    assert RunState.objects.get(pk=second).wake_at == held_until

    if its_worker == "returns":
        (tmp_path / f"open-{first}").touch()
    else:
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
    wait_until(
        lambda: RunState.objects.filter(pk=second, status=RunStatus.COMPLETED).exists(),
        timeout=60,
        what="the second run to complete",
    )
    log = _log(tmp_path)
    if its_worker == "returns":
        assert log[second, "entered"] >= log[first, "left"]
        assert RunState.objects.get(pk=first).lease_expires_at is None  # its worker let go
    else:
        assert (first, "left") not in log
        assert log[second, "entered"] >= held_until.timestamp()
    first_run = RunState.objects.get(pk=first)
    assert first_run.status == RunStatus.CANCELLED and "ordered twice" in first_run.reason
