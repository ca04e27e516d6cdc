"""`manage.py measure_loop`: times a step's loop with real checkpoint commits on a scratch run that never
outlives the command, and refuses what it must not or cannot measure."""

from __future__ import annotations

import time
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from durableruns import Workflow
from durableruns.models import RunState, RunStep

pytestmark = pytest.mark.django_db(transaction=True)

probe = Workflow("measure_loop_probe")
seen: dict[str, Any] = {}


@probe.step(policy="re_executable")
def price(ctx: Any) -> dict[str, Any]:
    priced = ctx.progress.setdefault("priced", [])
    for line in ctx.loop(list(range(ctx.input.get("lines", 30))), every=10):
        time.sleep(0.001)
        priced.append(line)
        # what the scratch run holds while the step runs: its checkpoints are real commits
        seen["rows"] = list(RunStep.objects.filter(run_id=ctx.run_id).values_list("step", "status", "loop_cursor"))
    seen["run_id"] = ctx.run_id
    seen["results"] = ctx.results
    return {"total": sum(priced)}


@probe.step(policy="re_executable")
def summarise(ctx: Any) -> dict[str, Any]:
    return {"done": True}


@probe.step(policy="re_executable")
def explode(ctx: Any) -> None:
    for _ in ctx.loop([1, 2, 3], every=1):
        raise ConnectionError("the price service went away")


@probe.step(policy="resolvable", lookup=lambda ctx: None)
def charge(ctx: Any) -> None:
    raise AssertionError("measure_loop must never run a step that acts on a far system")


@probe.step(policy="escalate")
def notify(ctx: Any) -> None:
    """Nobody can look this up."""
    raise AssertionError("measure_loop must never run a step that acts on a far system")


def measure_loop(*args: str) -> str:
    out = StringIO()
    call_command("measure_loop", *args, stdout=out)
    return out.getvalue()


def scratch_runs() -> int:
    return RunState.objects.filter(run_id__startswith="measure-loop-").count()


@pytest.fixture(autouse=True)
def clean():
    seen.clear()
    yield
    assert scratch_runs() == 0, "a scratch run outlived the command"


def test_it_times_the_loop_with_real_checkpoints_and_prints_the_table():
    out = measure_loop("measure_loop_probe", "price", "--input", '{"lines": 40}', "--results", '{"quote": 1}',
                       "--every", "1,5,20")
    assert seen["run_id"].startswith("measure-loop-") and seen["results"] == {"quote": 1}
    # one real checkpoint commit after every item but the last, on the started attempt of the scratch run
    assert seen["rows"][-1] == ("price", "started", 39)
    assert "measure_loop_probe.price: 40 items" in out and "checkpoints every 10" in out
    assert "mean of 39 real commits" in out
    lines = out.splitlines()
    table = [line for line in lines if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in table[1:]] == ["1", "5", "10 (the step's)", "20"]
    assert "| 10 (the step's) | 3 |" in out  # commits after 10, 20, 30
    assert any(line.startswith("balance point b* = sqrt(n * c / t) = ") for line in lines)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no_such_flow", "price"], "no workflow named 'no_such_flow'"),
        (["measure_loop_probe", "nope"], "has no step 'nope'"),
        (["measure_loop_probe", "charge"], "charge is resolvable: running it would act on a far system"),
        (["measure_loop_probe", "notify"], "notify is escalate: running it would act on a far system"),
        (["measure_loop_probe", "summarise"], "never called ctx.loop"),
        (["measure_loop_probe", "price", "--input", "{lines: 3"], "--input is not valid JSON"),
        (["measure_loop_probe", "price", "--input", "[1, 2]"], "--input must be a JSON object, not list"),
        (["measure_loop_probe", "price", "--results", "nope"], "--results is not valid JSON"),
        (["measure_loop_probe", "price", "--input", '{"lines": 1}'], "at least two items"),
        (["measure_loop_probe", "price", "--every", "5,0"], "at least 1"),
    ],
)
def test_it_refuses_with_a_clear_message(args, message):
    with pytest.raises(CommandError, match=message) as raised:
        measure_loop(*args)
    assert raised.value.returncode == 1


def test_the_scratch_run_is_deleted_when_the_step_raises():
    with pytest.raises(ConnectionError, match="went away"):
        measure_loop("measure_loop_probe", "explode")
