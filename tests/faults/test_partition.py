"""Three worker hosts, one cut off from PostgreSQL in the middle of a step: no effect twice, nothing lost.

The rig is real networking inside this sandbox (tests/faults/netns.py): three network namespaces on a bridge,
each running `resume_runs --loop` against a private PostgreSQL (tests/faults/pg_instance.py) that listens on the
bridge's address. While a host is inside a step that has booked a parcel, nftables in its namespace drops every
packet to and from PostgreSQL, so they vanish without a reset, as behind a dead switch. Then:

* another host takes the run once its lease has run out, settles the booking by its key (found: no second
  booking), and completes it;
* the cut-off worker, when the cut heals, writes nothing (its epoch is stale) and exits: 1 with a message that
  the database was unreachable and the next pass resumes, or 0 if all it met was the fence;
* every run completes, and no far ledger holds a second effect for any key;
* a host cut off while idle between passes gives up on its next claim within about a lease and exits 1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from project.purchasing.far import FarSystems
from tests.conftest import ROOT, wait_until
from tests.faults import netns
from tests.faults.pg_instance import PrivatePostgres, manage, private_postgres
from tests.faults.support import duplicates
from tests.logs import stray_tracebacks

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

LEASE = 2  # seconds: the takeover comes about one lease after the cut
RUNS = 6
HOLD = 8  # seconds the cut run's booking step holds the run after the carrier accepted (others: 0.5)
HOSTS = ("host-a", "host-b", "host-c")


@dataclass
class HostWorker:
    host: netns.Host
    name: str
    proc: subprocess.Popen[str]
    out: Path
    err: Path

    def output(self) -> tuple[str, str]:
        return self.out.read_text(), self.err.read_text()


@dataclass
class Rig:
    net: netns.Network
    pg: PrivatePostgres
    folder: Path
    workers: list[HostWorker]

    def start_worker(self, host: netns.Host, name: str) -> HostWorker:
        """`resume_runs --loop` inside `host`'s namespace, on PostgreSQL at the bridge's address."""
        env = dict(os.environ, DATABASE_URL=self.pg.url_via(self.net.gateway),
                   DJANGO_SETTINGS_MODULE="project.settings", DURABLERUNS_WORKFLOW_MODULES="tests.workflows",
                   DURABLERUNS_LEASE_SECONDS=str(LEASE),
                   DURABLERUNS_RETRY_BACKOFF_SECONDS="0", PYTHONUNBUFFERED="1")
        out, err = self.folder / f"{name}.out", self.folder / f"{name}.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            proc = subprocess.Popen(
                host.command(sys.executable, "manage.py", "resume_runs", "--skip-checks", "--loop", "--interval",
                             "0.2", "--lease", str(LEASE), "--worker", name),
                cwd=ROOT, env=env, stdout=stdout, stderr=stderr, text=True,
            )
        worker = HostWorker(host=host, name=name, proc=proc, out=out, err=err)
        self.workers.append(worker)
        return worker

    def run_row(self, run_id: str) -> tuple[str, str, int]:
        [(status, owner, epoch)] = self.pg.query(
            "SELECT status, owner, epoch FROM run_state WHERE run_id = %s", (run_id,))
        return status, owner, epoch

    def lease_expiry(self, run_id: str) -> object:
        return self.pg.query("SELECT lease_expires_at FROM run_state WHERE run_id = %s", (run_id,))[0][0]

    def attempts(self, run_id: str) -> list[tuple[object, ...]]:
        """(step, attempt, status, owner, epoch, resolution) of each attempt of the run."""
        return self.pg.query("SELECT step, attempt, status, owner, epoch, resolution FROM run_step "
                             "WHERE run_id = %s ORDER BY step, attempt", (run_id,))

    def statuses(self) -> dict[str, str]:
        return dict(self.pg.query("SELECT run_id, status FROM run_state"))  # type: ignore[arg-type]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """The bridge, three hosts and the private PostgreSQL; every worker killed and everything removed after."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CI runs as root)")
    with netns.network(HOSTS) as net, private_postgres(listen=("127.0.0.1", net.gateway), trust=(net.cidr,)) as pg:
        built = Rig(net=net, pg=pg, folder=tmp_path / "workers", workers=[])
        built.folder.mkdir()
        try:
            yield built
        finally:
            for worker in built.workers:  # before the namespaces go: a process keeps its namespace alive
                if worker.proc.poll() is None:
                    worker.proc.kill()
                worker.proc.wait(timeout=30)
            for host in net.hosts:
                if host.is_cut():
                    host.heal()


def start_runs(pg: PrivatePostgres, inputs: dict[str, dict[str, float]]) -> None:
    starter = manage(pg, "shell", "-c", "import json, durableruns\n"
                     f"for run_id, data in json.loads({json.dumps(json.dumps(inputs))}).items():\n"
                     "    durableruns.start('rig', data, run_id=run_id)\n",
                     DURABLERUNS_WORKFLOW_MODULES="tests.workflows")
    out, err = starter.communicate(timeout=60)
    assert starter.returncode == 0, err


def test_a_host_cut_off_mid_step_is_fenced_out_and_another_finishes_its_run_with_each_effect_once(
    rig: Rig, far: FarSystems
) -> None:
    cut_run = "rig-0"
    start_runs(rig.pg, {f"rig-{i}": {"hold": HOLD if i == 0 else 0.5} for i in range(RUNS)})
    for host, name in zip(rig.net.hosts, HOSTS, strict=True):
        rig.start_worker(host, name)

    # The cut falls while the run's booking step holds it, after the carrier accepted the booking and after the
    # heartbeat renewed the lease at least once (so its connection, too, is open when the packets start vanishing).
    wait_until(lambda: far.carrier.counts_by_key().get(f"{cut_run}:book_parcel") == 1, timeout=40,
               what="the cut run's booking")
    status, owner, epoch = rig.run_row(cut_run)
    owner = owner.split("#")[0]  # the host, whichever of its threads holds the run
    assert status == "running" and owner in HOSTS, (status, owner)
    booked_lease = rig.lease_expiry(cut_run)
    wait_until(lambda: rig.lease_expiry(cut_run) != booked_lease, timeout=2 * LEASE, what="a heartbeat renewal")
    cut = next(w for w in rig.workers if w.name == owner)
    cut.host.cut_from(rig.net.gateway)
    before_cut = {(row[0], row[1]): row for row in rig.attempts(cut_run)}

    # Another host takes the run over once the cut-off worker's lease has run out.
    wait_until(lambda: rig.run_row(cut_run)[2] > epoch, timeout=6 * LEASE, every=0.1,
               what="another host to take the cut run")
    _, taker, taken_epoch = rig.run_row(cut_run)
    taker = taker.split("#")[0]
    assert taker in HOSTS and taker != owner and taken_epoch > epoch
    assert cut.proc.poll() is None, "the cut-off worker was still inside its step when the run was taken"

    # Its own heartbeat meets the dead connection within about a lease (the kernel gives up on unacknowledged
    # data after tcp_user_timeout) instead of hanging on it.
    wait_until(lambda: "lease(s) not renewed" in cut.output()[1], timeout=3 * LEASE, every=0.1,
               what="the cut-off worker's heartbeat to give up on its connection")

    # The cut heals: the cut-off worker finds its step's result fenced out, or its connection gone, and stops.
    cut.host.heal()
    wait_until(lambda: set(rig.statuses().values()) == {"completed"}, timeout=40, every=0.1,
               what=f"every run to complete: {rig.statuses()}")
    wait_until(lambda: cut.proc.poll() is not None or f"{cut_run}: fenced_out" in cut.output()[0],
               timeout=HOLD + 6 * LEASE, every=0.1, what="the cut-off worker to give up on the run")

    # A host cut off while idle between passes does not hang on its next claim either: it gives up by itself
    # within about a lease (its claim's data stays unacknowledged past tcp_user_timeout) and exits 1.
    idle = next(w for w in rig.workers if w is not cut and w.proc.poll() is None)
    idle.host.cut_from(rig.net.gateway)
    wait_until(lambda: idle.proc.poll() is not None, timeout=4 * LEASE, every=0.1,
               what="the host cut off while idle to give up")
    idle.host.heal()
    for worker in rig.workers:
        if worker.proc.poll() is None:
            worker.proc.send_signal(signal.SIGTERM)
    for worker in rig.workers:
        worker.proc.wait(timeout=30)
    idle_out, idle_err = idle.output()
    assert idle.proc.returncode == 1, (idle.proc.returncode, idle_out, idle_err)
    assert "database error, pass stopped: the database is unreachable or dropped the connection" in idle_err
    assert "the next pass resumes" in idle_err and not stray_tracebacks(idle_err), idle_err

    out, err = cut.output()
    assert not stray_tracebacks(err) and "Exception in thread" not in err, err
    if cut.proc.returncode == 1:
        assert "database error, pass stopped: the database is unreachable or dropped the connection" in err, err
        assert "the next pass resumes" in err, err
    else:
        assert cut.proc.returncode == 0 and f"{cut_run}: fenced_out" in out, (cut.proc.returncode, out, err)
    assert f"{cut_run}: completed" not in out, out
    # The heartbeat reconnects after a dropped connection instead of renewing on a closed one until it ends.
    assert "reconnecting for the next beat" in err and "the connection is closed" not in err, err

    # It wrote nothing after the cut: no attempt of its epoch is new, and each that changed was settled by the
    # taker's lookup, never completed with what the cut-off worker's step returned.
    for row in rig.attempts(cut_run):
        if row[4] != epoch:
            continue
        key = (row[0], row[1])
        assert key in before_cut, ("an attempt recorded under the stale epoch after the cut", row)
        assert row == before_cut[key] or (row[2] == "completed" and row[5] == "lookup"), (before_cut[key], row)

    # The host never cut off ran to a clean end; every run completed with each effect once.
    for worker in rig.workers:
        if worker is not cut and worker is not idle:
            w_out, w_err = worker.output()
            assert worker.proc.returncode == 0 and not stray_tracebacks(w_err), (worker.name, w_out, w_err)
    assert set(rig.statuses().values()) == {"completed"} and len(rig.statuses()) == RUNS
    assert duplicates(far) == {}
    runs = [f"rig-{i}" for i in range(RUNS)]
    assert far.carrier.counts_by_key() == {f"{r}:book_parcel": 1 for r in runs}
    assert far.payments.counts_by_key() == {f"{r}:charge_card": 1 for r in runs}
    subjects = sorted(e["payload"]["subject"] for e in far.email.effects())
    assert subjects == sorted(f"{r}:booked" for r in runs)
