"""The record laid out over a Citus cluster (docs/citus.md): what `distribute_runs` changes, and how the store
tells a distributed record from one on a single node.

One shard holds a run and what its steps write: run_state, run_step, run_event and run_attribute are
distributed by run_id in one co-location group, so every fenced write of the hot path (the claim, an intent, a
result, a lease renewal, a wait, an event) names one run_id and is routed to one node, committed there alone (no
two-phase commit). run_plan, run_escalation and run_intervention are reference tables (a copy on every node,
joined with the runs anywhere): a plan is written once per fingerprint, an escalation or a staff decision once per
person's act, each then a two-phase commit over the nodes, never on a step's path; their keys (an escalation's
id, one decision per escalation) stay unique across the cluster, and the escalation queue is read on any node.
run_count, run_worker, run_schedule and run_rate_turn stay plain tables on the coordinator: none is written in a
run's fenced commit (docs/citus.md says why each may stay there).

What Citus refuses, and what replaces it:

- A unique key of a distributed table must hold run_id: run_event's primary key becomes (run_id, id); the
  debounce key's unique index (run_state_debounce_key_uniq) becomes a plain one on the same runs
  (run_state_debounce_key_idx), and a debounced start keeps the key's one run not begun by taking the key's lock
  on the coordinator first (store.debounce). A reference table cannot reference a distributed one: the foreign
  keys from run_escalation and run_intervention to run_state are dropped (Django deletes a run's escalations and
  decisions with it, as it always did: its foreign keys cascade in Python, not in the database).
- Triggers on run_state: the run_count triggers (they write another table, on the coordinator) are dropped, and
  the metrics' count of finished runs reads run_state itself, in parallel on every node (ops.metrics); the
  concurrency-limit triggers (they let a parked run of the same key go, which may sit on another shard) are
  dropped, the runs they had parked are made pending, and the cluster's claim walks past a limited run whose key
  is full instead of parking it (store.spread); the run_state_ended trigger (a
  NOTIFY that durableruns.result listens for) is dropped, and result() polls; run_state_wake_by_deadline, which
  reads and writes only the row it fires for, is kept (created on every shard with citus.enable_unsafe_triggers).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connections

from durableruns.limits import PARKED

# Distributed by run_id, co-located with run_state, in this order (run_state first: the others name it).
RUN_TABLES = ("run_state", "run_step", "run_event", "run_attribute")
REFERENCE_TABLES = ("run_plan", "run_escalation", "run_intervention", "run_inbox_item")
# Plain tables on the coordinator: written outside any run's fenced commit.
COORDINATOR_TABLES = ("run_count", "run_worker", "run_schedule", "run_rate_turn")

# The triggers Citus refuses on a distributed table (they reach beyond their row's shard), dropped.
DROPPED_TRIGGERS = (
    "run_state_count_insert",
    "run_state_count_update",
    "run_state_count_delete",
    "run_state_count_truncate",
    "run_state_slot_freed",
    "run_state_slot_let_go",
    "run_state_ended",
)

# Unique keys of distributed tables that do not hold run_id.
_DROPPED_INDEXES = ("run_state_debounce_key_uniq",)
# What replaces them: the same runs indexed without uniqueness (a debounced start finds its key's run through it).
_DEBOUNCE_INDEX = "run_state_debounce_key_idx"
_DEBOUNCE_INDEX_SQL = (
    f"CREATE INDEX IF NOT EXISTS {_DEBOUNCE_INDEX} ON run_state (workflow, debounce_key) "
    "WHERE debounce_key IS NOT NULL AND status IN ('pending', 'waiting')"
)
# Distributed tables whose primary key (id) becomes (run_id, id).
_RUN_ID_KEYS = ("run_event",)


def citus_version(using: str) -> str | None:
    """The version of Citus installed in the database `using`, or None (not a Citus coordinator)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'citus'")
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def distributed_tables(using: str) -> dict[str, str]:
    """The record's tables that Citus knows, by name: 'distributed' or 'reference'."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT logicalrelid::regclass::text, partmethod FROM pg_dist_partition "
            "WHERE logicalrelid::regclass::text LIKE 'run\\_%%'"
        )
        return {name: "reference" if method == "n" else "distributed" for name, method in cursor.fetchall()}


_distributed: dict[tuple[str, str], bool] = {}


def is_distributed(using: str) -> bool:
    """Whether the runs' database `using` holds a distributed record (run_state distributed by Citus), read once a
    process per database: a record distributed while workers run is seen by the workers started after."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return False
    key = (using, str(connection.settings_dict.get("NAME")))
    known = _distributed.get(key)
    if known is None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT to_regclass('pg_dist_partition') IS NOT NULL")
            (citus,) = cursor.fetchone()
            if citus:
                cursor.execute(
                    "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'run_state'::regclass)"
                )
                (citus,) = cursor.fetchone()
        known = _distributed[key] = bool(citus)
    return known


def on_one_node(using: str) -> bool:
    """Whether the runs' database `using` is PostgreSQL with a record on one node (not distributed by Citus): where
    the one-statement hot path, its prepared statements and the run_state triggers apply."""
    return connections[using].vendor == "postgresql" and not is_distributed(using)


def forget_layout() -> None:
    """Read the layout again at the next is_distributed() (after distribute_runs, in the process that ran it)."""
    _distributed.clear()


@dataclass(frozen=True)
class Layout:
    """What distribute_runs did: each table's move, in order, or nothing."""

    moves: tuple[str, ...]


def distribute(using: str) -> Layout:
    """Lay the record out on the Citus coordinator `using`; what is already laid out is left as it is, so a second
    call does nothing. Each table moves in a statement of its own (create_distributed_table copies its rows to the
    shards and blocks writes to that table while it does)."""
    connection = connections[using]
    known = distributed_tables(using)
    moves: list[str] = []
    with connection.cursor() as cursor:
        # The people's work items (run_inbox_item), where a release's migrations made them: beside the escalations
        # they point at. A table a release does not have is left out.
        cursor.execute(
            "SELECT t FROM unnest(%s::text[]) AS t WHERE to_regclass(t) IS NOT NULL", [list(REFERENCE_TABLES)]
        )
        references = [t for (t,) in cursor.fetchall()]
        if known.get("run_state") is None:
            cursor.execute("SET citus.enable_unsafe_triggers = on")
            for trigger in DROPPED_TRIGGERS:
                cursor.execute(f"DROP TRIGGER IF EXISTS {trigger} ON run_state")
            # Runs parked by their concurrency limit wait for a trigger just dropped to let them go: pending again,
            # as that trigger would make them, for the cluster's claim to admit under the limit (store.spread).
            cursor.execute(
                "UPDATE run_state SET status = 'pending', reason = '', wake_at = NULL, updated_at = now() "
                "WHERE status = 'waiting' AND concurrency_key IS NOT NULL AND reason = %s",
                [PARKED],
            )
            # A transaction that writes a reference table after a multi-shard statement (a prune's batch, Django
            # deleting runs with their escalations) must run over one connection per node: the database's default.
            cursor.execute(
                "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET citus.multi_shard_modify_mode = %L', "
                "current_database(), 'sequential'); END $$"
            )
            for index in _DROPPED_INDEXES:
                cursor.execute(f"DROP INDEX IF EXISTS {index}")
            cursor.execute(_DEBOUNCE_INDEX_SQL)
            # Django names its foreign keys by a hash: find those from the reference tables to run_state.
            cursor.execute(
                "SELECT conrelid::regclass::text, conname FROM pg_constraint WHERE contype = 'f' "
                "AND confrelid = 'run_state'::regclass AND conrelid::regclass::text = ANY(%s)",
                [list(REFERENCE_TABLES)],
            )
            for table, name in cursor.fetchall():
                cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
            for table in _RUN_ID_KEYS:
                cursor.execute(
                    f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {table}_pkey, ADD PRIMARY KEY (run_id, id)"
                )
        for table in references:
            if table not in known:
                cursor.execute("SELECT create_reference_table(%s)", [table])
                moves.append(f"{table}: reference table (a copy on every node)")
        for table in RUN_TABLES:
            if table not in known:
                cursor.execute("SET citus.enable_unsafe_triggers = on")
                colocate = "none" if table == "run_state" else "run_state"
                cursor.execute("SELECT create_distributed_table(%s, 'run_id', colocate_with => %s)", [table, colocate])
                moves.append(
                    f"{table}: distributed by run_id" + ("" if table == "run_state" else ", co-located with run_state")
                )
        # A record laid out by a release before debounced starts ran on a cluster: its index, built on the shards.
        cursor.execute("SELECT to_regclass(%s) IS NULL", [_DEBOUNCE_INDEX])
        if cursor.fetchone()[0]:
            cursor.execute(_DEBOUNCE_INDEX_SQL)
            moves.append(f"run_state: index {_DEBOUNCE_INDEX} (the runs a debounced start may replace)")
    forget_layout()
    return Layout(moves=tuple(moves))
