"""The failover rig: a primary and a streaming standby (pg_basebackup), workers on a multi-host connection, the
primary SIGKILLed mid-load and the standby promoted.

Workers connect with `HOST="a,b"` and `target_session_attrs=read-write` (a DATABASE_URL
`postgres://u@a:p1,b:p2/db?target_session_attrs=read-write`): libpq tries each host in turn and keeps the one
that accepts writes, so after the promotion a restarted worker lands on the new primary. The load is purchase
orders: a keyed charge (and other keyed far calls) and an unkeyed email (notify_buyer, escalate). Before the kill
the primary's WAL sender is stopped (SIGSTOP) for a second, or a loopback standby is never behind; then the
workers are frozen, the test reads what the primary has acknowledged, and every process of the primary and the
workers is SIGKILLed (a lost machine).

- Synchronous replication: nothing acknowledged is lost, no effect is done twice, no run is lost, every run
  completes (after staff decide the emails in doubt by looking in the outbox), the listener is back on the new
  primary, and durableruns says nothing about replication.
- Asynchronous replication: the test shows what is lost (facts the old primary acknowledged that the new one
  lacks) and what that costs (each effect done twice is a step whose fact was lost), and that durableruns warned
  about it at start.
- Asynchronous, with DURABLERUNS_STANDBY_INTENTS (the standby named, synchronous_commit = local): the emails'
  intents waited for the standby, so none was lost and no email went twice; nothing was said.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from project.purchasing.far import FarSystems
from tests.conftest import Workers, wait_until
from tests.faults.conftest import Report
from tests.faults.pg_instance import PrivatePostgres, manage, private_postgres, private_standby
from tests.faults.support import PLAN, PO_ENV, Worker, duplicates, reference, spawn

pytestmark = [pytest.mark.slow]

RUNS = 40
LOSS = "a failover could lose acknowledged commits"
LOAD_ENV = dict(PO_ENV, FAR_LATENCY="0.02", PURCHASING_QUOTE_ITEM_SECONDS="0.002")
ACTIVE = ("pending", "running", "waiting")


@pytest.fixture
def primary() -> Iterator[PrivatePostgres]:
    with private_postgres() as pg:
        yield pg


def configure(pg: PrivatePostgres, **settings: str) -> None:
    with psycopg.connect(host="127.0.0.1", port=pg.port, user="postgres", dbname="durableruns",
                         autocommit=True) as conn:
        for name, value in settings.items():
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")


def both(primary: PrivatePostgres, standby: PrivatePostgres) -> str:
    """The workers' DATABASE_URL: both hosts, the one that accepts writes."""
    return (f"postgres://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/durableruns"
            "?target_session_attrs=read-write")


def acknowledged(pg: PrivatePostgres) -> set[tuple[str, str, int, str]]:
    """Every attempt's fact as the server shows it now: (run, step, attempt, status)."""
    return set(pg.query("SELECT run_id, step, attempt, status FROM run_step"))


def lost_facts(before: set[tuple[str, str, int, str]], after: set[tuple[str, str, int, str]]
               ) -> set[tuple[str, str, int, str]]:
    """The facts `before` holds that `after` lost: an attempt `after` lacks, or has only as started where `before`
    had it ended. An attempt `after` shows further on than `before` is no loss: with synchronous replication a
    commit is visible on the primary only once the standby has confirmed it, so a commit the standby received
    while the stalled WAL sender had not yet passed on its reply is on the new primary and not yet in `before`."""
    ended = {fact[:3] for fact in after if fact[3] != "started"}
    present = {fact[:3] for fact in after}
    return {fact for fact in before
            if fact[:3] not in present or (fact[3] != "started" and fact[:3] not in ended)}


def kill_server(pg: PrivatePostgres) -> None:
    """SIGKILL the postmaster and every process it started (a lost machine, not a shutdown)."""
    postmaster = int((pg.data / "postmaster.pid").read_text().split()[0])
    children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == postmaster]
    for pid in (postmaster, *children):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _parent(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def start_orders(pg: PrivatePostgres) -> list[str]:
    run_ids = [f"PO-failover-{i:02d}" for i in range(RUNS)]
    script = ("import durableruns\n"
              f"for i in range({RUNS}):\n"
              f"    durableruns.start('purchase_order', {{'reference': 'PO-2026-%04d' % (800 + i), "
              f"'buyer': 'Harbour Foods', 'line_count': 5}}, run_id='PO-failover-%02d' % i)\n")
    starter = manage(pg, "shell", "-c", script)
    out, err = starter.communicate(timeout=60)
    assert starter.returncode == 0, err
    return run_ids


def launch(workers: Workers, folder: Path, name: str, url: str, **env: str) -> Worker:
    return spawn(workers, folder, name, "--loop", "--interval", "0.5", "--lease", "2", "--concurrency", "4",
                 DATABASE_URL=url, **LOAD_ENV, **env)


def decide_from_outbox(pg: PrivatePostgres, url: str) -> None:
    """Staff decide each open escalation of notify_buyer by looking in the outbox (the step's docstring)."""
    script = (
        "import durableruns\n"
        "from durableruns.models import Escalation, RunState\n"
        "from project.purchasing.far import systems\n"
        "far = systems()\n"
        "for e in Escalation.objects.open():\n"
        "    ref = RunState.objects.get(pk=e.run_id).input['reference']\n"
        "    sent = [m for m in far.email.effects() if m['payload']['subject'] == ref + ' has shipped']\n"
        "    if sent:\n"
        "        durableruns.decide(e.run_id, e.step, 'happened', by='alice', note='in the outbox',\n"
        "                           result={'message_id': 'msg_%s' % sent[0]['id'], **sent[0]['payload']})\n"
        "    else:\n"
        "        durableruns.decide(e.run_id, e.step, 'did_not_happen', by='alice', note='not in the outbox')\n"
    )
    proc = manage(pg, "shell", "-c", script, DATABASE_URL=url)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def statuses(pg: PrivatePostgres) -> dict[str, str]:
    return dict(pg.query("SELECT run_id, status FROM run_state"))


@pytest.mark.parametrize("replication", ["synchronous", "asynchronous", "asynchronous, intents protected"])
def test_a_failover_mid_load(primary: PrivatePostgres, far: FarSystems, workers: Workers, tmp_path: Path,
                             replication: str, fault_report: Report) -> None:
    with private_standby(primary) as standby:
        protected = replication.endswith("protected")
        if replication == "synchronous":
            configure(primary, synchronous_standby_names="standby1", synchronous_commit="on")
        elif protected:  # the standby named, but only the intents of steps with no key or lookup wait for it
            configure(primary, synchronous_standby_names="standby1", synchronous_commit="local")
        expected = "async" if replication == "asynchronous" else "sync"
        wait_until(lambda: primary.query("SELECT sync_state FROM pg_stat_replication") == [(expected,)],
                   timeout=30, what=f"the standby to stream ({expected})")
        url = both(primary, standby)
        run_ids = start_orders(primary)
        env = {"DURABLERUNS_STANDBY_INTENTS": "on"} if protected else {}
        first = [launch(workers, tmp_path, f"w{n}", url, **env) for n in (1, 2)]

        # Mid-load: a third of the runs completed; stall the WAL sender a second, read what is acknowledged, kill.
        wait_until(lambda: list(statuses(primary).values()).count("completed") >= RUNS // 3, timeout=120,
                   what="a third of the runs to complete")
        (sender,), = primary.query("SELECT pid FROM pg_stat_replication")
        os.kill(sender, signal.SIGSTOP)
        time.sleep(1.0)
        # The workers are frozen first, so what the primary shows now holds every commit they saw acknowledged.
        for worker in first:
            worker.proc.send_signal(signal.SIGSTOP)
        before = acknowledged(primary)
        kill_server(primary)
        for worker in first:  # the host is gone with it; a supervisor starts them anew
            worker.proc.kill()
            worker.proc.wait()
        standby.pg_ctl("-w", "promote")
        wait_until(lambda: standby.query("SELECT pg_is_in_recovery()") == [(False,)], what="the promotion")

        after = acknowledged(standby)
        lost = lost_facts(before, after)  # acknowledged by the old primary, absent from the new one
        first_err = "".join(w.output()[1] for w in first)

        # The supervisor restarts the workers, on the same multi-host connection: they land on the new primary.
        second = [launch(workers, tmp_path, f"w{n}-again", url, **env) for n in (1, 2)]
        settled = lambda: not set(statuses(standby).values()) & set(ACTIVE)  # noqa: E731
        wait_until(settled, timeout=120, what="the runs to settle on the new primary")
        decide_from_outbox(standby, url)
        wait_until(settled, timeout=120, what="the decided runs to finish")
        listening = standby.query("SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN durableruns_due'")
        pickups = [p for (p,) in standby.query("SELECT pickup FROM run_worker WHERE stopped_at IS NULL")]
        for worker in second:
            worker.proc.send_signal(signal.SIGTERM)
        for worker in second:
            worker.proc.wait(timeout=30)
        second_err = "".join(w.output()[1] for w in second)

        final = statuses(standby)
        sent = [e["payload"]["subject"] for e in far.email.effects()]
        emailed_twice = {s for s in sent if sent.count(s) > 1}
        if replication == "synchronous":
            assert lost == set(), sorted(lost)[:10]
            assert LOSS not in first_err + second_err
            assert sorted(final) == sorted(run_ids)  # no run lost
            assert set(final.values()) == {"completed"}, final
            assert duplicates(far) == {} and not emailed_twice
            assert len(sent) == RUNS
            steps = standby.query("SELECT run_id, step FROM run_step WHERE status = 'completed'")
            assert len(steps) == len(set(steps)) == RUNS * len(PLAN)
            assert listening == [(2,)] and all(p.startswith("listening") for p in pickups), pickups
        else:
            # What asynchronous replication loses: facts the old primary acknowledged, gone after the failover.
            assert lost, "the stalled standby missed nothing: the rig did not make it fall behind"
            assert {status for *_, status in lost} <= {"started", "completed"}
            if protected:
                # The emails' intents waited for the standby: none was lost (a result may be: the step is then in
                # doubt and staff look in the outbox), and no email went twice; the keyed and looked-up steps may
                # be called again (a provider's key absorbs that), and nothing was said.
                intents_lost = {f[:3] for f in lost} - {f[:3] for f in after}
                assert not emailed_twice and not {f for f in intents_lost if f[1] == "notify_buyer"}
                assert LOSS not in first_err + second_err
                assert sorted(final) == sorted(run_ids)
            else:
                # durableruns said so at start, in every worker, with the fix.
                assert first_err.count(LOSS) == 2 and "synchronous_standby_names" in first_err
            # What that costs: each effect done twice is a step whose acknowledged intent or result was lost (it
            # came back as never started, or in doubt with its lookup unable to see the first call's record).
            lost_steps = {(run_id, step) for run_id, step, _, _ in lost}
            twice = {tuple(key.split(":", 1)) for found in duplicates(far).values() for key in found}
            assert twice <= lost_steps, sorted(twice - lost_steps)
            run_of = {reference(800 + i): f"PO-failover-{i:02d}" for i in range(RUNS)}
            assert {(run_of[s.split()[0]], "notify_buyer") for s in emailed_twice} <= lost_steps
        fault_report(f"failover, {replication} replication", {
            "runs": RUNS, "acknowledged facts lost": len(lost), "runs emailed twice": len(emailed_twice),
            "keyed effects done twice": sum(map(len, duplicates(far).values()))})
