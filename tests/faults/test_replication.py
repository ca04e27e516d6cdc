"""A primary with a real streaming standby: durableruns says when a failover could lose an acknowledged commit,
and DURABLERUNS_STANDBY_INTENTS makes exactly the intents of steps with no key or lookup wait for the standby.

Both servers are private (tests/faults/pg_instance.py): the standby is made with pg_basebackup and streams from
the primary over loopback; the shared server on 5432 is never touched.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator

import psycopg
import pytest

from project.purchasing.far import FarSystems
from tests.conftest import wait_until
from tests.faults.pg_instance import PrivatePostgres, manage, private_postgres, private_standby
from tests.faults.support import PLAN, reference

pytestmark = [pytest.mark.slow]

LOSS = "a failover could lose acknowledged commits"


@pytest.fixture
def primary() -> Iterator[PrivatePostgres]:
    with private_postgres() as pg:
        yield pg


def configure(pg: PrivatePostgres, **settings: str) -> None:
    """ALTER SYSTEM each setting and reload: the server's own configuration, as an operator would set it."""
    with psycopg.connect(host="127.0.0.1", port=pg.port, user="postgres", dbname="durableruns",
                         autocommit=True) as conn:
        for name, value in settings.items():
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")


def sync_state(pg: PrivatePostgres) -> str | None:
    rows = pg.query("SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1' "
                    "AND state = 'streaming'")
    return rows[0][0] if rows else None


def said(pg: PrivatePostgres, *command: str, **env: str) -> tuple[int, str, str]:
    proc = manage(pg, *command, **env)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_resume_runs_and_runs_health_say_when_a_failover_could_lose_an_acknowledged_commit(
        primary: PrivatePostgres) -> None:
    # No standby: nothing to lose to a failover, nothing said.
    code, out, err = said(primary, "resume_runs", "--once")
    assert code == 0 and LOSS not in out + err, out + err

    with private_standby(primary) as standby:
        wait_until(lambda: sync_state(primary) == "async", timeout=30, what="the standby to stream")
        # Asynchronous replication: both commands say so, once, with the fix.
        code, out, err = said(primary, "resume_runs", "--once")
        assert code == 0 and err.count(LOSS) == 1 and "synchronous_standby_names" in err, err
        assert "standby1 (async)" in err and LOSS not in out
        code, out, err = said(primary, "runs_health")
        assert code == 1 and out.count(LOSS) == 1, out + err
        assert out.startswith("WARNING replication:"), out
        code, out, _ = said(primary, "runs_health", "--json")
        problems = json.loads(out)["problems"]
        assert [(p["check"], p["level"]) for p in problems] == [("replication", "warning")]

        # The standby is synchronous: nothing acknowledged can be lost; nothing said.
        configure(primary, synchronous_standby_names="standby1")
        wait_until(lambda: sync_state(primary) == "sync", timeout=30, what="the standby to be synchronous")
        code, out, err = said(primary, "resume_runs", "--once")
        assert code == 0 and LOSS not in out + err, out + err
        code, out, _ = said(primary, "runs_health")
        assert code == 0 and LOSS not in out, out

        # Synchronous standby, but commits do not wait for it (synchronous_commit = local): said, unless the
        # intents that need it wait (DURABLERUNS_STANDBY_INTENTS).
        configure(primary, synchronous_commit="local")
        code, out, err = said(primary, "resume_runs", "--once")
        assert err.count(LOSS) == 1 and "DURABLERUNS_STANDBY_INTENTS" in err, err
        code, out, _ = said(primary, "runs_health", DURABLERUNS_STANDBY_INTENTS="on")
        assert code == 0 and LOSS not in out, out
        assert standby.query("SELECT pg_is_in_recovery()") == [(True,)]


def start_orders(pg: PrivatePostgres, run_ids: list[str]) -> None:
    inputs = {run_id: {"reference": reference(700 + i), "buyer": "Harbour Foods", "line_count": 5}
              for i, run_id in enumerate(run_ids)}
    starter = manage(pg, "shell", "-c", "import json, durableruns\n"
                     f"for run_id, data in json.loads({json.dumps(json.dumps(inputs))}).items():\n"
                     "    durableruns.start('purchase_order', data, run_id=run_id)\n")
    out, err = starter.communicate(timeout=60)
    assert starter.returncode == 0, err


def steps(pg: PrivatePostgres, run_id: str) -> dict[str, str]:
    return dict(pg.query("SELECT step, status FROM run_step WHERE run_id = %s ORDER BY step, attempt", (run_id,)))


def waiting_for_standby(pg: PrivatePostgres) -> int:
    (n,), = pg.query("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
    return n


@pytest.mark.parametrize("prepared", ["1", "0"], ids=["prepared", "unprepared"])
def test_with_the_standby_gone_only_the_intent_of_a_step_with_no_key_or_lookup_waits_for_it(
        primary: PrivatePostgres, far: FarSystems, prepared: str) -> None:
    """synchronous_commit = local with a synchronous standby named, and that standby stopped: every commit is
    acknowledged at once, except, with DURABLERUNS_STANDBY_INTENTS, the intent of notify_buyer (escalate: an email
    has no key and no lookup), which waits until the standby is back; then the run finishes, one email sent."""
    with private_standby(primary) as standby:
        configure(primary, synchronous_standby_names="standby1", synchronous_commit="local")
        wait_until(lambda: sync_state(primary) == "sync", timeout=30, what="the standby to be synchronous")
        standby.pg_ctl("-m", "fast", "-w", "stop")
        wait_until(lambda: sync_state(primary) is None, timeout=30, what="the standby to be gone")

        # Unprotected: the whole order runs, its every commit acknowledged without the standby.
        start_orders(primary, ["PO-async"])
        code, out, err = said(primary, "resume_runs", "--once")
        assert code == 0 and "PO-async: completed" in out, out + err
        assert far.email.count() == 1

        # Protected: everything up to the email's intent commits; that commit waits for the standby.
        start_orders(primary, ["PO-protected"])
        worker = manage(primary, "resume_runs", "--once", "--concurrency", "1", DURABLERUNS_STANDBY_INTENTS="on",
                        DURABLERUNS_PREPARED_STATEMENTS=prepared)
        try:
            wait_until(lambda: waiting_for_standby(primary) == 1, timeout=60, what="a commit waiting for the standby")
            # book_shipment's result shares its commit with notify_buyer's intent: neither is acknowledged yet.
            assert steps(primary, "PO-protected") == {**{s: "completed" for s in PLAN[:-2]},
                                                      "book_shipment": "started"}
            assert far.email.count() == 1 and worker.poll() is None
            standby.pg_ctl("-o", f"-p {standby.port} -k {standby.folder} -c listen_addresses=127.0.0.1 "
                                 f"-c fsync=off -c cluster_name=standby1", "-w", "start")
            out, err = worker.communicate(timeout=60)
        finally:
            if worker.poll() is None:
                worker.send_signal(signal.SIGKILL)
                worker.communicate()
        assert worker.returncode == 0 and "PO-protected: completed" in out, out + err
        assert steps(primary, "PO-protected") == {s: "completed" for s in PLAN}
        assert far.email.count() == 2 and waiting_for_standby(primary) == 0

