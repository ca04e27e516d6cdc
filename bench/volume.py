"""Ten million rows: what the record's readers cost on a big record, beside the same on a small one.

Two record sizes live side by side in one database (``dr_bench_volume``), each in its own schema
(``volume_<runs>``) holding copies of durableruns' tables (columns, check constraints and indexes re-created from
the migrated public tables, as bench/claim_cost.py does): run_state, run_step, run_escalation, run_intervention
and run_plan, with run_count and the triggers on run_state that keep it (sync_counts). Each is filled with COPY
(not the engine): `runs` runs of a nine-step plan with ATTEMPTS attempts each (one step retried after a failed
attempt), created over the last 180 days, finished minutes after they started; a mix of statuses (mostly completed; failed, cancelled; waiting on a wake time up to 60 days ahead;
running under a live lease; stopped for staff on an open escalation; a few completed after a staff decision).

Each reader is then timed on both schemas in alternating rounds, with Django's connection pointed at the schema
(search_path): the claim (store.claim, with a few pending runs recorded for it), the admin's runs list (first
page, a status filter, a search by run_id), a run page, the escalation queue, the API's run list (the first page
and the next, by its cursor), runs_health's checks and the metrics endpoint; pages are fetched with Django's test
Client, signed in as a superuser, in this process. The figures: each reader's median ms, its ratio big/small
(target <= 1.5) and its query count on each (target: equal).

    nice -n 10 python -m bench.volume [--runs 1000000] [--small 10000] [--reuse] [--rounds 7] [--out bench/results]

The schemas are built once and kept: with --reuse an existing schema of the right size is used as it is, its
indexes brought up to those of the public tables (so a new index is measured without a rebuild). The default
size (--runs 20000 against --small 2000) runs in a minute, for the smoke test; the published figures are
--runs 1000000 --small 10000.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import app

DEFAULT_DB = "dr_bench_volume"
TABLES = ("run_plan", "run_state", "run_step", "run_escalation", "run_intervention")
ATTEMPTS = 10  # per run: nine steps, one of them tried twice
SPAN_DAYS = 180
OWNER = "bench-volume"
DEFAULT_OUT = Path(__file__).resolve().parent / "results"

# Out of every 1,000 finished runs (by a hash of the run's number): the rest are completed.
FINISHED_MIX = (("failed", 25), ("cancelled", 10), ("decided", 2))  # decided: completed after staff decided
# an escalation of its step 5
# The unfinished runs, in every 17: waiting on a wake time, stopped for staff on an open escalation, running.
LIVE_MIX = (("waiting", 10), ("needs_decision", 5), ("running", 2))
LIVE_SHARE = 0.017  # of the small record: the same live work at both sizes, whatever the history behind it


def schema_name(runs: int) -> str:
    return f"volume_{runs}"


def _kind(i: int, runs: int, live: int) -> str:
    """The newest `live` runs are the unfinished ones; the history behind them is finished."""
    if i >= runs - live:
        r = i % 17
        for kind, share in LIVE_MIX:
            if r < share:
                return kind
            r -= share
    r = (i * 7919 + 13) % 1000
    for kind, share in FINISHED_MIX:
        if r < share:
            return kind
        r -= share
    return "completed"


def run_id(i: int) -> str:
    """Run ids in no relation to their age (as uuids or order numbers from elsewhere are)."""
    return f"order-{(i * 2654435761) % (1 << 32):08x}-{i}"


# -- building -----------------------------------------------------------------------------------------------


def _indexes(schema: str) -> dict[str, str]:
    """Index name -> definition of durableruns' tables in `schema`."""
    rows = app.execute(
        "SELECT c2.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
        "JOIN pg_class c2 ON c2.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = ANY(%s)", [schema, list(TABLES)])
    return dict(rows)


def sync_indexes(schema: str) -> list[str]:
    """Make `schema`'s indexes those of the public tables (same names and definitions); return what changed.

    What each was built from is kept in the schema's bench_indexes table: PostgreSQL spells a rebuilt partial
    index's predicate differently from the migrated one, so the definitions are compared as built, not as read."""
    want = _indexes("public")
    app.execute(f"CREATE TABLE IF NOT EXISTS {schema}.bench_indexes (name text PRIMARY KEY, definition text)")
    built = dict(app.execute(f"SELECT name, definition FROM {schema}.bench_indexes"))
    have = _indexes(schema)
    changed = []
    for name in have:
        if name not in want or built.get(name) != want[name]:
            app.execute(f'DROP INDEX {schema}."{name}"')
            app.execute(f"DELETE FROM {schema}.bench_indexes WHERE name = %s", [name])
            changed.append(f"dropped {name}")
    for name, definition in want.items():
        if name not in have or built.get(name) != definition:
            app.execute(definition.replace(" ON public.", f" ON {schema}.", 1))
            app.execute(f"INSERT INTO {schema}.bench_indexes VALUES (%s, %s) ON CONFLICT (name) DO UPDATE "
                        "SET definition = EXCLUDED.definition", [name, definition])
            changed.append(f"built {name}")
    if changed:
        for table in TABLES:
            app.execute(f"ANALYZE {schema}.{table}")
    return changed


FINISHED = ("completed", "failed", "cancelled")


def _triggers(schema: str) -> dict[str, str]:
    """Trigger name -> definition of the user triggers on `schema`.run_state."""
    rows = app.execute(
        "SELECT t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = 'run_state' "
        "AND NOT t.tgisinternal", [schema])
    return dict(rows)


def sync_counts(schema: str) -> list[str]:
    """Give `schema` the run_count table and the triggers on run_state that keep it, as the migrated public tables
    have them (migration run_count); return what changed.

    The triggers are the public ones re-created on the schema's run_state; their functions stay in public and name
    run_count unqualified, so they write the run_count of the schema the search_path puts first (measure() points
    it at the schema). As with the indexes, what each was built from is kept in bench_indexes (PostgreSQL spells
    a re-created trigger's WHEN differently). The rows are COPYed before the triggers exist, so whenever the table
    or a trigger is new the counts are made again from the rows (nothing else writes the bench's schemas)."""
    changed = []
    app.execute(f"CREATE TABLE IF NOT EXISTS {schema}.bench_indexes (name text PRIMARY KEY, definition text)")
    if not app.execute("SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = 'run_count'", [schema]):
        app.execute(f"CREATE TABLE {schema}.run_count (LIKE public.run_count INCLUDING ALL)")
        changed.append("built run_count")
    want, have = _triggers("public"), _triggers(schema)
    built = {name[len("trigger:"):]: definition for name, definition in app.execute(
        f"SELECT name, definition FROM {schema}.bench_indexes WHERE name LIKE 'trigger:%%'")}
    if set(want) != set(have) or any(built.get(name) != definition for name, definition in want.items()):
        for name in have:
            app.execute(f'DROP TRIGGER "{name}" ON {schema}.run_state')
        app.execute(f"DELETE FROM {schema}.bench_indexes WHERE name LIKE 'trigger:%%'")
        for name, definition in want.items():
            app.execute(definition.replace(" ON public.run_state ", f" ON {schema}.run_state ", 1))
            app.execute(f"INSERT INTO {schema}.bench_indexes VALUES (%s, %s)", [f"trigger:{name}", definition])
        changed.append(f"triggers {', '.join(sorted(want)) or 'none'}")
    if changed:
        app.execute(f"TRUNCATE {schema}.run_count")
        app.execute(f"INSERT INTO {schema}.run_count (workflow, status, shard, present, finished) "
                    f"SELECT workflow, status, 0, count(*), count(*) FROM {schema}.run_state "
                    "WHERE status = ANY(%s) GROUP BY workflow, status", [list(FINISHED)])
        app.execute(f"ANALYZE {schema}.run_count")
    return changed


def _label(runs: int, live: int) -> str:
    return f"built {runs} runs, {live} unfinished"


def _ready(schema: str, runs: int, live: int) -> bool:
    row = app.execute("SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s", [schema])
    return bool(row) and row[0][0] == _label(runs, live)


def _ts(t: datetime.datetime) -> str:
    return t.isoformat()


def _rows(runs: int, live: int, base: datetime.datetime, fingerprint: str, steps: tuple[str, ...]
          ) -> Iterator[tuple[str, str, str, str]]:
    """COPY text lines of each run: (run_state, run_step lines, run_escalation, run_intervention)."""
    span = SPAN_DAYS * 86400
    for i in range(runs):
        rid = run_id(i)
        kind = _kind(i, runs, live)
        if kind in ("waiting", "running", "needs_decision"):  # the unfinished are recent
            created = base - datetime.timedelta(seconds=(i * 37) % (14 * 86400) + 600)
        else:
            created = base - datetime.timedelta(seconds=span * (runs - i) / runs + 3600)
        started = [created + datetime.timedelta(seconds=2 * k) for k in range(ATTEMPTS)]
        retried = i % 9  # the step tried twice: its first attempt failed
        status = "completed" if kind == "decided" else kind
        lease = wake = r"\N"
        cursor, reason = 9, ""
        last_status = "completed"
        if kind == "waiting":
            wake = _ts(base + datetime.timedelta(seconds=(i * 53) % (60 * 86400) + 86400))
            cursor, reason = 9, "waiting for the approval of step_9"
        elif kind == "running":
            lease = _ts(base + datetime.timedelta(days=3650))
            cursor, last_status = 8, "started"
        elif kind == "needs_decision":
            cursor, last_status, reason = 8, "started", "step_9 in doubt: escalated"
        elif kind == "failed":
            cursor, last_status, reason = 8, "failed", "step_9 raised ValueError: card declined"
        elif kind == "cancelled":
            reason = "cancelled by staff"
        finished = started[-1] + datetime.timedelta(seconds=1)
        owner = "web-1:4242" if kind == "running" else ""
        state = "\t".join((rid, "bench_noop9", fingerprint, status, str(cursor), owner, "3", lease, wake, reason, "",
                           f'{{"order": {i}}}', r"\N", _ts(created), _ts(finished), r"\N"))
        attempts = []
        k = 0
        for s, step in enumerate(steps):
            tries = 2 if s == retried else 1
            for attempt in range(1, tries + 1):
                last = k == ATTEMPTS - 1
                st = last_status if last else ("failed" if attempt < tries else "completed")
                done = r"\N" if st == "started" else _ts(started[k] + datetime.timedelta(seconds=1))
                result = '{"ok": true}' if st == "completed" else r"\N"
                error = "ValueError: timeout" if st == "failed" else ""
                resolution = "decision" if (kind == "decided" and s == 4) else ("returned" if st == "completed" else "")
                attempts.append("\t".join((rid, step, str(attempt), st, f"{rid}:{step}", _ts(started[k]), done,
                                           r"\N", r"\N", r"\N", result, error, resolution, "web-1:4242", "3", "0",
                                           "{}")))
                k += 1
        escalation = intervention = ""
        if kind in ("needs_decision", "decided"):
            step, n = (steps[-1], 1 if retried != 8 else 2) if kind == "needs_decision" else (steps[4], 1)
            opened = _ts(started[-1] + datetime.timedelta(seconds=30))
            escalation = "\t".join((str(i + 1), rid, step, str(n), f"{rid}:{step}", _ts(started[-1]), opened,
                                    "no lookup: staff must check", r"\N"))
            if kind == "decided":
                intervention = "\t".join((str(i + 1), rid, str(i + 1), step, str(n), "happened", "ops@example.com",
                                          r"\N", _ts(finished), "checked with the provider", '{"ok": true}'))
        yield state, "\n".join(attempts), escalation, intervention


COLUMNS = {
    "run_state": "run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, lease_expires_at, wake_at, "
                 "reason, ending, input, trace_context, created_at, updated_at, alerted_at",
    "run_step": "run_id, step, attempt, status, effect_key, started_at, finished_at, renewed_at, held_until, "
                "raised_at, result, error, resolution, owner, epoch, loop_cursor, progress",
    "run_escalation": "id, run_id, step, attempt, effect_key, in_doubt_since, opened_at, reason, alerted_at",
    "run_intervention": "id, run_id, escalation_id, step, attempt, action, decided_by, user_id, decided_at, note, "
                        "result",
}


def build(runs: int, *, live: int, log: Callable[[str], None]) -> float:
    """(Re)create schema volume_<runs> and fill it with COPY; return the seconds it took."""
    from django.db import connection

    from bench.workflows import noop9

    schema = schema_name(runs)
    began = time.perf_counter()
    app.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    app.execute(f"CREATE SCHEMA {schema}")
    for table in TABLES:
        app.execute(f"CREATE TABLE {schema}.{table} (LIKE public.{table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    base = app.execute("SELECT now()")[0][0]
    steps = tuple(noop9.plan)
    app.execute(f"INSERT INTO {schema}.run_plan (fingerprint, workflow, steps, first_seen) VALUES (%s, %s, %s, %s)",
                [noop9.fingerprint, noop9.name, json.dumps([[s, "re_executable"] for s in steps]),
                 base - datetime.timedelta(days=SPAN_DAYS + 1)])
    chunk = 20_000
    with connection.cursor() as cursor:
        pg = cursor.cursor  # psycopg's own cursor, for COPY
        rows = _rows(runs, live, base, noop9.fingerprint, steps)
        done = 0
        while done < runs:
            buffers = {table: io.StringIO() for table in COLUMNS}
            for _ in range(min(chunk, runs - done)):
                state, attempts, escalation, intervention = next(rows)
                buffers["run_state"].write(state + "\n")
                buffers["run_step"].write(attempts + "\n")
                if escalation:
                    buffers["run_escalation"].write(escalation + "\n")
                if intervention:
                    buffers["run_intervention"].write(intervention + "\n")
            for table, buffer in buffers.items():
                if buffer.tell():
                    with pg.copy(f"COPY {schema}.{table} ({COLUMNS[table]}) FROM STDIN") as copy:
                        copy.write(buffer.getvalue())
            done += min(chunk, runs - done)
            if done % 100_000 == 0 or done == runs:
                log(f"{schema}: {done} runs copied ({time.perf_counter() - began:.0f} s)")
    sync_indexes(schema)  # after the rows: building an index once is cheaper than maintaining it
    sync_counts(schema)  # after the rows too: the triggers would count each COPYed run one by one
    log(f"{schema}: indexes built, runs counted ({time.perf_counter() - began:.0f} s)")
    for table in TABLES:
        app.execute(f"VACUUM ANALYZE {schema}.{table}")
    app.execute(f"COMMENT ON SCHEMA {schema} IS '{_label(runs, live)}'")
    seconds = time.perf_counter() - began
    log(f"{schema}: built in {seconds:.0f} s")
    return seconds


def prepare(runs: int, *, live: int, reuse: bool, log: Callable[[str], None]) -> dict[str, Any]:
    schema = schema_name(runs)
    if reuse and _ready(schema, runs, live):
        changed = sync_indexes(schema)
        counts = sync_counts(schema)
        log(f"{schema}: reused" + (f" ({', '.join(changed + counts)})" if changed or counts else ""))
        return {"schema": schema, "built": False, "build_s": 0.0, "index_changes": changed, "count_changes": counts}
    return {"schema": schema, "built": True, "build_s": round(build(runs, live=live, log=log), 1), "index_changes": [],
            "count_changes": []}


# -- the readers ------------------------------------------------------------------------------------------


@contextmanager
def search_path(schema: str) -> Iterator[None]:
    """Point Django's connection at `schema` first (the auth and session tables stay in public)."""
    app.execute(f"SET search_path TO {schema}, public")
    try:
        yield
    finally:
        app.execute("SET search_path TO DEFAULT")


def _samples(schema: str) -> dict[str, str]:
    """A run of each kind in the schema, found by its own index reads (not timed)."""
    pick = {}
    for kind, where in (("escalated", "status = 'needs_decision'"), ("completed", "status = 'completed'")):
        pick[kind] = app.execute(f"SELECT run_id FROM {schema}.run_state WHERE {where} "
                                 "ORDER BY created_at DESC LIMIT 1 OFFSET 3")[0][0]
    return pick


def readers(client: Any, samples: dict[str, str]) -> dict[str, Callable[[], None]]:
    """Each reader: a call that reads one page (asserting it answered 200) or does one claim round."""
    from django.core.management import call_command

    from durableruns import store

    def page(url: str, **params: str) -> Callable[[], None]:
        def read() -> None:
            response = client.get(url, params)
            if response.status_code != 200:
                raise RuntimeError(f"{url} {params}: {response.status_code} {response.content[:300]!r}")
        return read

    def api_second_page() -> None:
        first = client.get("/api/runs/")
        if first.status_code != 200:
            raise RuntimeError(f"/api/runs/: {first.status_code}")
        second = client.get(first.json()["next"])
        if second.status_code != 200:
            raise RuntimeError(f"the API's next page: {second.status_code}")

    def health() -> None:
        from django.core.management.base import CommandError
        try:
            call_command("runs_health", stdout=io.StringIO(), stderr=io.StringIO())
        except CommandError:  # problems found (the escalations are old): exit 2, still a full read
            pass

    def claim() -> None:
        for _ in range(CLAIMS):
            if store.claim(owner=OWNER, lease_seconds=30) is None:
                raise RuntimeError("nothing to claim")

    return {
        "claim": claim,
        "admin_runs_first_page": page("/admin/durableruns/runstate/"),
        "admin_runs_status_filter": page("/admin/durableruns/runstate/", status__exact="waiting"),
        "admin_runs_search_run_id": page("/admin/durableruns/runstate/", q=samples["completed"]),
        "admin_run_page": page(f"/admin/durableruns/runstate/{samples['escalated']}/change/"),
        "admin_escalation_queue": page("/admin/durableruns/escalation/"),
        "api_runs_first_page": page("/api/runs/"),
        "api_runs_next_page": api_second_page,
        "runs_health": health,
        "metrics": page("/durableruns/metrics"),
    }


CLAIMS = 20  # claims per claim round: pending runs are recorded for them before each round


def _refill(schema: str) -> None:
    from bench.workflows import noop9

    app.execute(f"DELETE FROM {schema}.run_state WHERE owner = %s OR run_id LIKE 'due-%%'", [OWNER])
    app.execute(
        f"INSERT INTO {schema}.run_state (run_id, workflow, plan_fingerprint, status, cursor, owner, epoch, "
        "reason, input, created_at, updated_at) SELECT 'due-' || g, %s, %s, 'pending', 0, '', 0, '', '{}'::jsonb, "
        "now() + g * interval '1 microsecond', now() FROM generate_series(1, %s) g",
        [noop9.name, noop9.fingerprint, CLAIMS])


def measure(sizes: tuple[int, ...], *, rounds: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Median ms and query count of every reader on each size's schema, rounds alternating between sizes."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    user, _ = get_user_model().objects.get_or_create(username="bench-volume", defaults={"is_staff": True,
                                                                                          "is_superuser": True})
    client = Client()
    client.force_login(user)
    schemas = {n: schema_name(n) for n in sizes}
    samples = {n: _samples(schemas[n]) for n in sizes}
    times: dict[int, dict[str, list[float]]] = {n: {} for n in sizes}
    queries: dict[int, dict[str, int]] = {n: {} for n in sizes}
    # A warm-up read of every reader on each size first (a process's first read of a plan or a permission
    # caches it), then one read of each counting its queries, then the timed rounds, alternating the sizes.
    for phase in ["warm", "count", *range(1, rounds + 1)]:
        order = sizes if phase == "count" or (isinstance(phase, int) and phase % 2) else tuple(reversed(sizes))
        for n in order:
            with search_path(schemas[n]):
                for name, read in readers(client, samples[n]).items():
                    if name == "claim":
                        _refill(schemas[n])
                    if phase == "count":
                        with CaptureQueriesContext(connection) as seen:
                            read()
                        queries[n][name] = len(seen.captured_queries)
                        continue
                    began = time.perf_counter()
                    read()
                    ms = (time.perf_counter() - began) * 1e3
                    if phase != "warm":
                        times[n].setdefault(name, []).append(ms / CLAIMS if name == "claim" else ms)
        log(f"{phase if phase in ('warm', 'count') else f'round {phase}'} done")
    for n in sizes:
        with search_path(schemas[n]):  # the delete's trigger writes the run_count the search_path names
            app.execute(f"DELETE FROM {schemas[n]}.run_state WHERE owner = %s OR run_id LIKE 'due-%%'", [OWNER])
    small, big = sizes[0], sizes[-1]
    rows = {}
    for name in times[big]:
        a, b = statistics.median(times[small][name]), statistics.median(times[big][name])
        rows[name] = {"small_ms": round(a, 2), "big_ms": round(b, 2), "ratio": round(b / a, 2),
                      "small_queries": queries[small][name], "big_queries": queries[big][name],
                      "ok": b <= 1.5 * a and queries[small][name] == queries[big][name]}
    return {"readers": rows, "samples": {str(n): samples[n] for n in sizes}}


def explain(schema: str, sql: str) -> list[str]:
    with search_path(schema):
        return [row[0] for row in app.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)]


# -- the command -------------------------------------------------------------------------------------------


def write(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "volume.json").write_text(json.dumps(result, indent=2) + "\n")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.volume", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000, help="runs in the big record (default 20000)")
    parser.add_argument("--small", type=int, default=2_000, help="runs in the small record (default 2000)")
    parser.add_argument("--db", default=DEFAULT_DB, help=f"the bench's own database (default {DEFAULT_DB})")
    parser.add_argument("--reuse", action="store_true", help="use the schemas already built at these sizes")
    parser.add_argument("--rounds", type=int, default=7, help="timed reads of each reader on each size")
    parser.add_argument("--out", type=Path, default=None, help="write volume.json there (e.g. bench/results)")
    args = parser.parse_args(argv)
    if not 0 < args.small < args.runs:
        parser.error("--small must be positive and smaller than --runs")

    def log(line: str) -> None:
        print(f"volume: {line}", file=sys.stderr, flush=True)

    app.configure(args.db)
    import bench.workflows  # noqa: F401  registers bench_noop9 in this process

    began = time.perf_counter()
    live = max(17, int(args.small * LIVE_SHARE))
    built = {str(n): prepare(n, live=live, reuse=args.reuse, log=log) for n in (args.small, args.runs)}
    figures = measure((args.small, args.runs), rounds=args.rounds, log=log)
    result = {
        "command": "nice -n 10 python -m bench.volume " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "runs": args.runs, "small": args.small, "attempts_per_run": ATTEMPTS, "unfinished_runs": live, "rounds": args.rounds,
        "loadavg": os.getloadavg(), "schemas": built, **figures, "seconds": round(time.perf_counter() - began, 1),
    }
    if args.out is not None:
        write(args.out, result)
    for name, row in figures["readers"].items():
        print(f"{'PASS' if row['ok'] else 'FAIL'}  {name}: {row['small_ms']} ms at {args.small} runs, "
              f"{row['big_ms']} ms at {args.runs} ({row['ratio']}x); queries {row['small_queries']} -> "
              f"{row['big_queries']}")
    return result


if __name__ == "__main__":
    main()
