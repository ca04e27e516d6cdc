"""Recovery against DBOS: finishing a batch of runs whose worker was SIGKILLed in the middle of step 5.

For durableruns the crashed runs are built in bulk with the exact rows a worker killed between step 5's intent
and its result leaves (bench.records.create_crashed, mirroring tests/factories.py crash_after_intent: four
completed attempts, step 5 started under the dead worker's epoch, the run `running` under an expired lease);
building them this way rather than killing a real worker makes every round start from the same record (one
worker holds one run at a time, so a kill leaves one run in doubt, not 1,000). Each measurement first checks
that the built record is the one a SIGKILL leaves: a real `resume_runs` process is killed right after step 5's
intent (durableruns.testing, DURABLERUNS_CRASH_AT) and its run's record is compared, field by field but for
ids, owner and times, with a built one. Then
1 (and 2) `manage.py resume_runs` processes claim each run, compute its boundary (4 done, step 5 in doubt),
re-run step 5 (re_executable: a no-op) as attempt 2 and finish steps 6 to 9. The time runs from starting the
processes to the last one exiting, interpreter start-up included. DBOS is measured by
bench.dbos_baseline.measure_recovery: its workflows really are SIGKILLed in step 5, and its time runs from
constructing DBOS in a fresh process (imports already done) until every workflow has succeeded.
"""

from __future__ import annotations

import signal
from typing import Any

from bench import app, dbos_baseline, records
from bench.pg import Databases
from bench.stats import ratio, rotation, summarize
from bench.workflows import IN_DOUBT_STEP, NOOP_STEPS

DONE_BEFORE_CRASH = 4


def one_round(dbname: str, *, runs: int, workers: int) -> float:
    """Seconds for ``workers`` processes to finish ``runs`` crashed runs (checked afterwards)."""
    app.reset()
    records.create_crashed(runs, done=DONE_BEFORE_CRASH)
    seconds = app.work_all(dbname, workers).seconds
    counts = app.status_counts()
    rerun = app.execute("SELECT count(*) FROM run_step WHERE step = %s AND attempt = 2 AND status = 'completed'",
                        [IN_DOUBT_STEP])[0][0]
    completed_rows = app.execute("SELECT count(*) FROM run_step WHERE status = 'completed'")[0][0]
    if counts != {"completed": runs} or rerun != runs or completed_rows != runs * NOOP_STEPS:
        raise RuntimeError(f"recovery with {workers} worker(s) left {counts}, {rerun} re-run {IN_DOUBT_STEP}, "
                           f"{completed_rows} completed attempts (expected {runs}, {runs}, {runs * NOOP_STEPS})")
    return seconds


def record_shape(run_id: str) -> dict[str, Any]:
    """A run's record without what differs between two runs in the same state: ids, owner and times."""
    [(status, cursor, epoch, lease_set)] = app.execute(
        "SELECT status, cursor, epoch, lease_expires_at IS NOT NULL FROM run_state WHERE run_id = %s", [run_id])
    attempts = app.execute(
        "SELECT step, attempt, status, replace(effect_key, run_id, '<run>'), resolution, result, finished_at IS NULL,"
        " loop_cursor, progress, epoch FROM run_step WHERE run_id = %s ORDER BY started_at, step", [run_id])
    return {"status": status, "cursor": cursor, "epoch": epoch, "lease_set": lease_set,
            "attempts": [list(row) for row in attempts]}


def crash_fidelity(dbname: str) -> dict[str, Any]:
    """Kill a real worker right after step 5's intent and check that the record it leaves is the one
    records.create_crashed builds; raise if not."""
    app.reset()
    [killed] = records.create_pending(1)
    crash_at = f"{IN_DOUBT_STEP}@after_intent"
    app.run_workers(dbname, 1, "--limit", "1", "--lease", "30", env_extra={"DURABLERUNS_CRASH_AT": crash_at},
                    exits=(-signal.SIGKILL,))
    [built] = records.create_crashed(1, done=DONE_BEFORE_CRASH)
    left, made = record_shape(killed), record_shape(built)
    app.reset()
    if left != made:
        raise RuntimeError(f"the built crashed run differs from what a SIGKILL at {crash_at} leaves:\n"
                           f"killed: {left}\nbuilt:  {made}")
    return {"killed_at": crash_at, "record": left, "same_as_built": True}


def measure(*, dbs: Databases, runs: int, repeat: int) -> dict[str, Any]:
    """Figure 8: seconds to finish ``runs`` crashed runs with 1 and 2 workers, and DBOS for the same case."""
    fidelity = crash_fidelity(dbs.app)
    rounds = ("durableruns_1", "durableruns_2", "dbos", "startup")
    seconds: dict[str, list[float]] = {name: [] for name in rounds}
    dbos_details: list[dict[str, Any]] = []
    for _, name in rotation(rounds, repeat):
        if name == "dbos":
            result = dbos_baseline.measure_recovery(workflows_count=runs, dbname=dbs.dbos_recovery)
            dbos_details.append(result)
            seconds[name].append(result["recovery_s"])
        elif name == "startup":
            seconds[name].append(app.startup_seconds(dbs.app))
        else:
            seconds[name].append(one_round(dbs.app, runs=runs, workers=int(name[-1])))
    app.reset()
    remaining = NOOP_STEPS - DONE_BEFORE_CRASH
    startup = seconds.pop("startup")
    seconds["durableruns_1_net_of_startup"] = [s - up for s, up in zip(seconds["durableruns_1"], startup)]
    summaries = {name: summarize(samples) for name, samples in seconds.items()}
    figures: dict[str, Any] = {}
    for name, summary in summaries.items():
        figures[name] = {"seconds": summary,
                         "steps_per_s": summarize([runs * remaining / s for s in seconds[name]])}
    figures["process_startup_s"] = summarize(startup)
    figures["dbos"]["launch_s"] = summarize([d["launch_s"] for d in dbos_details])
    figures["dbos"]["first_step_s"] = summarize([d["first_step_s"] for d in dbos_details if d["first_step_s"]])
    for name in ("durableruns_1", "durableruns_2", "durableruns_1_net_of_startup"):
        figures[f"{name}_over_dbos"] = ratio(summaries[name], summaries["dbos"])
    figures["crash_fidelity"] = fidelity
    figures["params"] = {
        "runs": runs, "steps_per_run": NOOP_STEPS, "done_before_crash": DONE_BEFORE_CRASH,
        "in_doubt_step": IN_DOUBT_STEP, "steps_to_finish_per_run": remaining, "rounds": repeat,
        "durableruns_crash": "rows built in bulk, checked in the same run against the record a real SIGKILL "
                             f"of resume_runs at {fidelity['killed_at']} leaves (the same but for ids, owner "
                             "and times)",
        "durableruns_timing": "wall time from starting resume_runs processes until the last exited, "
                              "interpreter and Django start-up included; net_of_startup subtracts the same "
                              "round's empty resume_runs process",
        "dbos_crash": "real SIGKILL of a DBOS process whose workflows block in step 5",
        "dbos_timing": "from constructing DBOS in a fresh process (imports done) until all SUCCESS",
    }
    return figures
