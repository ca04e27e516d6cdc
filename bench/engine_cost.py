"""What a durable step costs: durableruns end to end against the raw psycopg floor and against DBOS.

Eight workloads are timed side by side in rotating rounds (so a load that drifts hits all of them): one
committed single-row UPDATE through raw psycopg, both on the settings Django uses (client-side binding) and on
those of durableruns' hot path (prepared); a step's bookkeeping done by hand (two commits, and one fenced
statement) on Django's settings; a 9-step run of no-op steps through durableruns
(services.start_run, then services.resume_due in this process: claim, boundary, intent, result), with its
statements prepared (the default) and not, and with its steps declared intent=False (their results share one
commit: durableruns.held); and the same
9 no-op steps as a DBOS Transact workflow. It also counts the commits durableruns makes per run, which the
design bounds at (9 + 3) / 9 per step: the run's creation, its claim, the first intent, then one commit per step
that records its result together with the next step's intent (the last one completes the run). On PostgreSQL the
first intent rides on the claim, so a run makes 9 + 2.

bench.engine_ab times the same in-process run alone, this checkout against another.
"""

from __future__ import annotations

import cProfile
import io
import pstats
from typing import Any

from bench import app, dbos_baseline, floor
from bench.pg import Databases
from bench.stats import Workload, interleave, ratio
from bench.workflows import NOOP_STEPS, noop9, noop9_held
from django.test import override_settings

from durableruns import services

WORKFLOW = noop9.name


def run_once(workflow: str = WORKFLOW) -> None:
    """One 9-step run end to end: recorded pending, then claimed and worked by a resume pass."""
    run_id = services.start_run(workflow, {})
    report = services.resume_due(limit=1)
    outcome = report.outcomes[0] if report.outcomes else None
    if outcome is None or outcome.run_id != run_id or outcome.status != "completed":
        raise RuntimeError(f"the bench run did not complete in one pass: {report.summary()}")


def durableruns_workload(runs: int, *, prepared: bool = True, held: bool = False) -> Workload:
    """``runs`` runs end to end; with ``prepared`` False, the hot path as it was before it prepared its statements
    (DURABLERUNS_PREPARED_STATEMENTS off), to show what preparing buys; with ``held``, the steps declared
    intent=False (bench.workflows.noop9_held: one commit for the nine results)."""
    workflow = noop9_held.name if held else WORKFLOW

    def work(_setup: None) -> None:
        with override_settings(DURABLERUNS_PREPARED_STATEMENTS=prepared):
            for _ in range(runs):
                run_once(workflow)

    name = "durableruns_held" if held else "durableruns" if prepared else "durableruns_unprepared"
    return Workload(name=name, run=work, ops=runs * NOOP_STEPS)


def count_commits() -> dict[str, Any]:
    """The transactions one run commits, counted statement by statement on Django's connection."""
    with app.counting_commits() as commits:
        run_once()
    return {"write_commits_per_run": commits.writes, "read_transactions_per_run": commits.reads,
            "statements_per_run": len(commits.statements),
            "write_commits_per_step": commits.writes / NOOP_STEPS,
            "design_bound_per_step": (NOOP_STEPS + 3) / NOOP_STEPS,
            "statements": [" ".join(s.split())[:120] for s in commits.statements]}


def profile(runs: int, top: int = 25) -> str:
    """cProfile of ``runs`` runs end to end, the ``top`` functions by internal time (to find hot spots)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(runs):
        run_once()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def measure(*, dbs: Databases, repeat: int, runs: int, commits: int, dbos_workflows: int) -> dict[str, Any]:
    """Figures 1 to 3: ms per commit / per step for each workload, medians over ``repeat`` rounds, and ratios."""
    app.reset()
    with floor.connect(dbs.floor) as conn, floor.connect(dbs.floor, prepared=True) as prepared, \
            dbos_baseline.steps_session(dbs.dbos_steps) as dbos:
        floor.reset_tables(conn)
        selfcheck = floor.selfcheck(dbs.floor)
        workloads = [
            floor.commit_workload(conn, commits=commits),
            floor.commit_workload(prepared, commits=commits, name="floor_commit_prepared"),
            floor.two_commit_workload(conn, runs=runs, steps=NOOP_STEPS),
            floor.one_statement_workload(conn, runs=runs, steps=NOOP_STEPS),
            durableruns_workload(runs),
            durableruns_workload(runs, prepared=False),
            durableruns_workload(runs, held=True),
            dbos(dbos_workflows),
        ]
        ms = interleave(workloads, repeat=repeat)
    commit_count = count_commits()
    app.reset()
    engine, dbos_ms = ms["durableruns"], ms["dbos"]
    # The floor is the faster of the two ways to send a commit: durableruns' hot path prepares its statements,
    # so it is held to whichever floor is lower in this run.
    commit_ms = min(ms["floor_commit"], ms["floor_commit_prepared"], key=lambda summary: summary["median"])
    per_step_floor = {k: (v * commit_count["write_commits_per_step"] if k != "n" else v)
                      for k, v in commit_ms.items()}
    return {
        "ms_per_commit_floor": commit_ms,
        "ms_per_commit_floor_client_side": ms["floor_commit"],
        "ms_per_commit_floor_prepared": ms["floor_commit_prepared"],
        "ms_per_step_floor_two_commits": ms["floor_two_commit_step"],
        "ms_per_step_floor_one_statement": ms["floor_one_statement_step"],
        "ms_per_step_durableruns": engine,
        "ms_per_step_durableruns_unprepared": ms["durableruns_unprepared"],
        "durableruns_prepared_over_unprepared": ratio(engine, ms["durableruns_unprepared"]),
        "ms_per_step_dbos": dbos_ms,
        "durableruns_over_floor_commit": ratio(engine, commit_ms),
        "durableruns_over_floor_of_its_commits": ratio(engine, per_step_floor),
        "durableruns_over_floor_one_statement": ratio(engine, ms["floor_one_statement_step"]),
        "durableruns_over_dbos": ratio(engine, dbos_ms),
        "ms_per_step_durableruns_held": ms["durableruns_held"],
        "durableruns_held_over_floor_commit": ratio(ms["durableruns_held"], commit_ms),
        "durableruns_held_over_dbos": ratio(ms["durableruns_held"], dbos_ms),
        "commits": commit_count,
        "floor_selfcheck": selfcheck,
        "params": {"rounds": repeat, "order": "rotating rounds: A B C D E, B C D E A, ...",
                   "floor_commits_per_round": commits, "runs_per_round": runs, "steps_per_run": NOOP_STEPS,
                   "dbos_workflows_per_round": dbos_workflows,
                   "durableruns_path": "services.start_run + services.resume_due(limit=1) in-process"},
    }

