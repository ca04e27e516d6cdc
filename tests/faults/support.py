"""Helpers shared by the fault tests: purchase-order runs, the probe's log, resuming until runs settle, ledgers.

Worker subprocesses get PO_ENV: lags shrunk so a resume is quick, and tests.faults.probe loaded so every point a
worker reaches is logged before an armed kill fires.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durableruns import services
from durableruns.models import RunState, RunStatus
from project.purchasing.far import FarSystems
from tests.conftest import ROOT, Workers, wait_until
from tests.logs import stray_tracebacks

PLAN: tuple[str, ...] = (
    "parse_request", "quote", "credit_check", "reserve_stock", "charge", "place_order", "book_shipment",
    "notify_buyer",
)
POLICY: dict[str, str] = {
    "parse_request": "re_executable",
    "quote": "re_executable",
    "credit_check": "resolvable",
    "reserve_stock": "resolvable",
    "charge": "resolvable",
    "place_order": "resolvable",
    "book_shipment": "resolvable",
    "notify_buyer": "escalate",
}
# The far system each resolvable step acts on, by its name in FarSystems.
SYSTEM_OF: dict[str, str] = {
    "credit_check": "credit", "reserve_stock": "warehouse", "charge": "payments", "place_order": "portal",
    "book_shipment": "carrier",
}
LOOP_EVERY = 25  # the quote step's checkpoint interval (project/purchasing/workflows.py)

# Lags shrunk for worker processes: the credit vendor's lookup still lags (0.5 s), the call timeout is 1 s.
PO_ENV: dict[str, str] = {
    "DURABLERUNS_WORKFLOW_MODULES": "tests.faults.probe",
    "FAR_CREDIT_LOOKUP_LAG": "0.5",
    "PURCHASING_CALL_TIMEOUT": "1",
    "DURABLERUNS_RETRY_BACKOFF_SECONDS": "0",
    "DURABLERUNS_LOOKUP_RETRY_SECONDS": "0.5",
}
ACTIVE = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING)


def reference(n: int) -> str:
    return f"PO-2026-{n:04d}"


def start_purchase(run_id: str, n: int, *, lines: int = 240) -> str:
    """Start a purchase_order run for order number `n` with `lines` order lines."""
    return services.start_run(
        "purchase_order", {"reference": reference(n), "buyer": "Harbour Foods", "line_count": lines}, run_id=run_id
    )


def statuses(run_ids: Iterable[str]) -> dict[str, str]:
    return dict(RunState.objects.filter(pk__in=list(run_ids)).values_list("run_id", "status"))


@dataclass(frozen=True)
class Probe:
    """The event log written by tests.faults.probe in every worker that was given FAULTS_PROBE_LOG."""

    path: Path

    def env(self) -> dict[str, str]:
        return {"FAULTS_PROBE_LOG": str(self.path)}

    def events(self) -> list[tuple[str, str, str]]:
        """(worker thread as pid.thread, event, argument) in the order written; event is a point or 'claim'
        (argument: the run)."""
        if not self.path.exists():
            return []
        out = []
        text = self.path.read_text()
        # Read while other workers still write: a reader may see the last append half copied (Linux serialises
        # writes to a file, not a read against a write). Lines are only ever appended, so only the last can be
        # cut short, and one without its newline is left for the next read.
        complete = text if text.endswith("\n") else text[: text.rfind("\n") + 1]
        for line in complete.splitlines():
            thread, event, arg = line.split(" ", 2)
            out.append((thread, event, arg))
        return out

    def by_run(self) -> dict[str, list[tuple[str, str, str]]]:
        """Events grouped by the run each worker thread was working when it wrote them."""
        current: dict[str, str] = {}
        grouped: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
        for thread, event, arg in self.events():
            if event == "claim":
                current[thread] = arg
            elif thread in current:
                grouped[current[thread]].append((thread, event, arg))
        return grouped

    def last_point(self, pid: int) -> tuple[str, str] | None:
        """The last point a worker process logged: where it died, if it was killed by an armed fault."""
        mine = [(event, arg) for t, event, arg in self.events() if t.split(".")[0] == str(pid) and event != "claim"]
        return mine[-1] if mine else None

    def loop_items(self, run_id: str, step: str = "quote") -> int:
        """How many loop items of `step` were finished for `run_id`, over every attempt and worker."""
        return sum(1 for _, event, arg in self.by_run().get(run_id, []) if event.startswith("loop:") and arg == step)


@dataclass
class Worker:
    """A resume_runs process whose output goes to files (a long --loop would fill a pipe nobody reads)."""

    proc: subprocess.Popen[str]
    out: Path
    err: Path

    def output(self) -> tuple[str, str]:
        return self.out.read_text(), self.err.read_text()


def spawn(workers: Workers, folder: Path, name: str, *args: str, **env: str) -> Worker:
    """Start `manage.py resume_runs ARGS --worker NAME` with its output in FOLDER/NAME.out and .err."""
    folder.mkdir(parents=True, exist_ok=True)
    out, err = folder / f"{name}.out", folder / f"{name}.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "resume_runs", "--skip-checks", *args, "--worker", name],
            cwd=ROOT, env=workers.env(**env), stdout=stdout, stderr=stderr, text=True,
        )
    workers.procs.append(proc)  # the fixture kills it if the test fails first
    return Worker(proc=proc, out=out, err=err)


def settle(workers: Workers, run_ids: list[str], env: dict[str, str], *, folder: Path, timeout: float = 90,
           concurrency: int = 1) -> str:
    """Run one resume_runs --loop worker (`concurrency` threads) until no run is pending, running or waiting;
    stop it with SIGTERM.

    Returns what it printed. It must exit 0 without a traceback: waiting and needs_decision are outcomes.
    """
    name = f"resumer-{len(workers.procs)}"
    worker = spawn(workers, folder, name, "--loop", "--interval", "0.1", "--lease", "1", "-v", "2",
                   "--concurrency", str(concurrency), **env)
    # SIGTERM ends --loop cleanly only once the command has installed its handler: its first summary says so.
    wait_until(lambda: worker.out.stat().st_size > 0 or worker.proc.poll() is not None, timeout=30,
               what="the resumer's first pass")
    proc = worker.proc
    try:
        wait_until(lambda: not set(statuses(run_ids).values()) & set(ACTIVE) or proc.poll() is not None,
                   timeout=timeout, every=0.1, what=f"runs to settle: {statuses(run_ids)}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    out, err = worker.output()
    assert proc.returncode == 0 and not stray_tracebacks(err), f"resume_runs exited {proc.returncode}:\n{out}\n{err}"
    left = {r: s for r, s in statuses(run_ids).items() if s in ACTIVE}
    assert not left, f"runs not settled: {left}\n{out}"
    return out


def kill_worker(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a worker (as an OOM killer or a lost host would) and reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
    proc.communicate()


def ledger_view(far: FarSystems, step: str, key: str) -> Any:
    """What the far system holds under `key`, in the shape the step records as its result."""
    system = getattr(far, SYSTEM_OF[step])
    if step == "place_order":
        return system.get_by_key(key)
    if step == "credit_check":
        effects = system.effects(key)
        return {"check_id": f"cc_{effects[0]['id']}"} if effects else None
    if step == "reserve_stock":
        return system.find_reservation(key)
    return system.lookup(key)


def matches_ledger(step: str, result: Any, view: Any) -> bool:
    if step == "credit_check":
        return view is not None and result is not None and result.get("check_id") == view["check_id"]
    return result == view


def leaked(far: FarSystems, run_ids: Iterable[str]) -> list[dict[str, Any]]:
    """Reservations the warehouse still holds for these runs: what runs that ended unfinished must not leave."""
    mine = {f"{run_id}:reserve_stock" for run_id in run_ids}
    return [r for r in far.warehouse.held() if r["key"] in mine]


def total_effects(far: FarSystems) -> int:
    return sum(system.count() for system in far)


def duplicates(far: FarSystems) -> dict[str, dict[str, int]]:
    """Keys holding more than one effect, per keyed system (credit included: it does not deduplicate)."""
    found = {name: getattr(far, name).duplicates()
             for name in ("portal", "credit", "payments", "carrier", "warehouse")}
    return {name: d for name, d in found.items() if d}
