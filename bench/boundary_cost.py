"""Boundary cost: what a resume pays to know where a run stands, as the attempts of its steps pile up.

For a 9-step run with 1, 10 and 100 attempts per step (the earlier ones failed, the latest completed), it
times services.boundary_of on the run loaded from the database beforehand: one query for every attempt of
the run, then the pure partition. CaptureQueriesContext shows that it is one query however many attempts.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from bench import app
from bench.stats import Workload, interleave
from bench.workflows import noop9
from durableruns import services
from durableruns.models import RunState, RunStatus, RunStep, StepStatus
from durableruns.registry import effect_key


def make_run(attempts_per_step: int) -> str:
    """A completed 9-step run whose every step took ``attempts_per_step`` attempts."""
    now = timezone.now()
    run_id = f"boundary-{attempts_per_step}"
    RunState.objects.filter(pk=run_id).delete()
    RunState.objects.create(run_id=run_id, workflow=noop9.name, plan_fingerprint=noop9.fingerprint,
                            status=RunStatus.COMPLETED, cursor=len(noop9.plan), created_at=now, updated_at=now)
    rows = []
    for index, step in enumerate(noop9.plan):
        for attempt in range(1, attempts_per_step + 1):
            last = attempt == attempts_per_step
            at = now + timedelta(milliseconds=index * attempts_per_step + attempt)
            rows.append(RunStep(run_id=run_id, step=step, attempt=attempt,
                                status=StepStatus.COMPLETED if last else StepStatus.FAILED,
                                effect_key=effect_key(run_id, step), started_at=at, finished_at=at,
                                result={"step": step} if last else None, error="" if last else "Rejected: no",
                                owner="bench", epoch=1))
    RunStep.objects.bulk_create(rows, batch_size=5000)
    return run_id


def boundary_workload(attempts_per_step: int, calls: int) -> Workload:
    run = RunState.objects.get(pk=make_run(attempts_per_step))

    def work(_prepared: None) -> None:
        for _ in range(calls):
            services.boundary_of(run)

    return Workload(name=f"attempts_{attempts_per_step}", run=work, ops=calls)


def queries(attempts_per_step: int) -> dict[str, Any]:
    """The queries one boundary_of makes, captured, and a check of what it computed."""
    run = RunState.objects.get(pk=f"boundary-{attempts_per_step}")
    with CaptureQueriesContext(connection) as captured:
        boundary = services.boundary_of(run)
    if list(boundary.done) != list(noop9.plan):
        raise RuntimeError(f"boundary of {run.run_id} is {boundary}, expected every step done")
    return {"count": len(captured.captured_queries),
            "sql": [" ".join(q["sql"].split()) for q in captured.captured_queries]}


def measure(*, attempts: tuple[int, ...], calls: int, repeat: int) -> dict[str, Any]:
    """Figure 7: ms per boundary_of for each number of attempts per step, with the one query it makes."""
    app.reset()
    ms = interleave([boundary_workload(n, calls) for n in attempts], repeat=repeat)
    figures = {str(n): {"ms_per_boundary": ms[f"attempts_{n}"], "rows_read": n * len(noop9.plan),
                        "queries": queries(n)} for n in attempts}
    app.reset()
    return {"attempts_per_step": figures,
            "params": {"steps": len(noop9.plan), "calls_per_round": calls, "rounds": repeat,
                       "timed": "services.boundary_of(run) on a RunState loaded beforehand: the attempts query "
                                "and the pure compute_boundary"}}
