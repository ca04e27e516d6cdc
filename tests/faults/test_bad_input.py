"""Bad input meets real worker processes: each gets a clear error, and nothing is lost or done twice.

tests/integration/test_engine.py checks each rule in-process on the `scripted` workflow (an unknown workflow
at start, an input that is not JSON, a result that is not JSON, a lookup that raises, a plan this deploy
cannot run, a decision applied once), and tests/api covers malformed request bodies and a second decision
(409). Here the same failures arrive the way they do in production: through the purchase order, a deploy that
changed, the far systems, `manage.py resume_runs` (its lines and exit status), and two people at once.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

import durableruns
from durableruns import services
from durableruns.errors import AlreadyDecided
from durableruns.models import Escalation, Intervention, RunState, RunStatus, RunStep
from project.purchasing.far import FarSystems
from tests.conftest import Workers, wait_until
from tests.faults.support import PLAN, PO_ENV, reference, settle, start_purchase
from tests.logs import stray_tracebacks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

CURRENT = dict(PO_ENV, DURABLERUNS_WORKFLOW_MODULES="")  # this deploy: purchase_order only
DEPLOY_V2 = dict(PO_ENV, DURABLERUNS_WORKFLOW_MODULES="tests.faults.deploy_v2")
OLD = dict(PO_ENV, DURABLERUNS_WORKFLOW_MODULES="tests.faults.deploys")  # last year's deploy


def attempts(run_id: str, step: str) -> list[tuple[int, str, str]]:
    return list(RunStep.objects.filter(run_id=run_id, step=step).order_by("attempt")
                .values_list("attempt", "status", "resolution"))


def run(run_id: str) -> RunState:
    return RunState.objects.get(pk=run_id)


def crash(workers: Workers, run_id: str, at: str, env: dict[str, str]) -> None:
    """A worker of `env`'s deploy works `run_id` and is SIGKILLed at `at`; its lease then runs out."""
    proc = workers.start("--run", run_id, "--lease", "0.5", **env, DURABLERUNS_CRASH_AT=at)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -9, out + err
    time.sleep(0.6)


def resume(workers: Workers, env: dict[str, str], *args: str) -> str:
    """One resume_runs pass of `env`'s deploy; it must exit 0 without a traceback. Returns what it printed."""
    proc = workers.start("--lease", "1", *args, **env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and not stray_tracebacks(err), out + err
    return out


def test_a_run_whose_workflow_left_the_deploy_waits_for_a_deploy_that_has_it_and_finishes_there(
    far: FarSystems, workers: Workers
) -> None:
    # A run started under last year's deploy, whose flow was called purchase_order_2025 (same plan, so the same
    # fingerprint; tests/faults/deploys.py declares it for the old deploy's workers, never in this process).
    run_id = start_purchase("PO-retired", 400, lines=30)
    RunState.objects.filter(pk=run_id).update(workflow="purchase_order_2025")
    preview = resume(workers, CURRENT, "--dry-run")
    assert "would leave it for a deploy that has workflow 'purchase_order_2025'" in preview, preview
    out = resume(workers, CURRENT)
    assert f"{run_id}: waiting - waiting for a deploy that has workflow 'purchase_order_2025'" in out, out
    left = run(run_id)
    assert left.status == RunStatus.WAITING and left.input["reference"] == reference(400)
    assert "parse_request (re_executable)" in left.reason  # the run's own plan, named
    assert RunStep.objects.filter(run_id=run_id).count() == 0 and far.payments.count() == 0

    # Nothing was lost: a worker of the deploy that has the workflow finishes it, once.
    out = resume(workers, OLD, "--run", run_id)
    assert f"{run_id}: completed" in out, out
    assert far.payments.counts_by_key() == {f"{run_id}:charge": 1} and far.portal.count() == 1


def test_a_purchase_request_that_can_never_be_valid_fails_with_the_reason_and_acts_nowhere(
    far: FarSystems, workers: Workers
) -> None:
    run_id = services.start_run("purchase_order", {"reference": "PO-2026-0401", "buyer": "Harbour Foods",
                                                   "line_count": "lots"}, run_id="PO-bad-request")
    out = resume(workers, CURRENT)
    reason = "parse_request: durableruns.errors.Rejected: line_count must be an integer from 1 to 10000, not 'lots'"
    assert f"{run_id}: failed - {reason}" in out, out
    assert attempts(run_id, "parse_request") == [(1, "failed", ""), (2, "failed", ""), (3, "failed", "")]
    assert RunStep.objects.filter(run_id=run_id).exclude(step="parse_request").count() == 0
    assert sum(system.count() for system in far) == 0


def test_a_deploy_whose_re_executable_step_returns_non_json_fails_the_run_and_records_nothing_completed(
    far: FarSystems, workers: Workers
) -> None:
    run_id = start_purchase("PO-non-json-quote", 402, lines=30)
    buggy = dict(PO_ENV, DURABLERUNS_WORKFLOW_MODULES="tests.faults.deploy_buggy", FAULTS_BUGGY_STEP="quote")
    out = resume(workers, buggy)
    assert f"{run_id}: failed - quote: durableruns.errors.ResultNotJSON: the result of quote is not JSON" in out, out
    assert "Decimal" in out
    assert [status for _, status, _ in attempts(run_id, "quote")] == ["failed", "failed", "failed"]
    assert "ResultNotJSON" in RunStep.objects.get(run_id=run_id, step="quote", attempt=3).error
    assert sum(system.count() for system in far) == 0  # nothing after quote ran

    # The fix is deployed; staff retry the run; it completes with every effect once.
    services.retry_run(run_id, by="ops", note="fixed the Decimal in quote")
    assert f"{run_id}: completed" in resume(workers, CURRENT)
    assert far.payments.counts_by_key() == {f"{run_id}:charge": 1}


def test_a_resolvable_step_that_acted_then_returned_non_json_is_settled_by_its_lookup_not_run_again(
    far: FarSystems, workers: Workers
) -> None:
    run_id = start_purchase("PO-non-json-charge", 403, lines=30)
    buggy = dict(PO_ENV, DURABLERUNS_WORKFLOW_MODULES="tests.faults.deploy_buggy", FAULTS_BUGGY_STEP="charge")
    out = resume(workers, buggy)
    # The charge went through before its result failed to encode: in doubt, found by key, recorded as found.
    assert f"{run_id}: completed" in out, out
    assert attempts(run_id, "charge") == [(1, "completed", "lookup")]
    result = RunStep.objects.get(run_id=run_id, step="charge").result
    assert result == far.payments.lookup(f"{run_id}:charge") and isinstance(result and result["amount"], int)
    assert far.payments.count() == 1


def test_a_lookup_that_raises_leaves_the_run_waiting_and_never_acts_twice(
    far: FarSystems, workers: Workers, tmp_path: Path
) -> None:
    run_id = start_purchase("PO-lookup-down", 404, lines=30)
    crash(workers, run_id, "charge@after_effect", CURRENT)
    assert far.payments.counts_by_key() == {f"{run_id}:charge": 1}

    # The payment provider cannot be reached by the resume: its lookup raises, which proves nothing.
    unreachable = tmp_path / "provider-down"
    unreachable.write_text("not a directory")
    out = resume(workers, dict(CURRENT, FAR_DIR=str(unreachable)))
    assert f"{run_id}: waiting - lookup raised (FileExistsError" in out and "asking again later" in out, out
    assert attempts(run_id, "charge") == [(1, "started", "")]
    assert run(run_id).status == RunStatus.WAITING and "lookup raised" in run(run_id).reason

    # Reachable again: found by our key, completed with the provider's record, and still one charge.
    wake_at = run(run_id).wake_at
    assert wake_at is not None
    wait_until(lambda: wake_at <= timezone.now(), what="the lookup's retry time")
    out = resume(workers, CURRENT)
    assert f"{run_id}: completed" in out, out
    assert attempts(run_id, "charge") == [(1, "completed", "lookup")]
    assert far.payments.counts_by_key() == {f"{run_id}:charge": 1}


def test_a_deploy_that_inserts_a_step_lets_an_in_flight_run_finish_its_own_plan(
    far: FarSystems, workers: Workers, tmp_path: Path
) -> None:
    run_id = start_purchase("PO-redeployed", 405, lines=30)
    crash(workers, run_id, "charge@after_intent", CURRENT)  # charge in doubt, nothing charged yet

    # Deploy v2 inserts confirm_budget before charge: the run started before it finishes its own plan.
    settle(workers, [run_id], DEPLOY_V2, folder=tmp_path)
    assert run(run_id).status == RunStatus.COMPLETED
    assert attempts(run_id, "charge") == [(1, "started", ""), (2, "completed", "returned")]
    assert not RunStep.objects.filter(run_id=run_id, step="confirm_budget").exists()  # nothing added
    assert set(RunStep.objects.filter(run_id=run_id).values_list("step", flat=True)) == set(PLAN)
    assert far.payments.counts_by_key() == {f"{run_id}:charge": 1}
    assert durableruns.boundary(run_id).plan == PLAN  # read through its own plan, whatever this deploy has


def test_two_people_deciding_the_same_escalation_at_once_apply_one_decision(far: FarSystems, workers: Workers) -> None:
    run_id = start_purchase("PO-two-clerks", 406, lines=30)
    crash(workers, run_id, "notify_buyer@after_effect", CURRENT)
    resume(workers, CURRENT)
    assert run(run_id).status == RunStatus.NEEDS_DECISION
    (message,) = [e for e in far.email.effects() if e["payload"]["subject"] == f"{reference(406)} has shipped"]

    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def clerk(name: str) -> None:
        try:
            barrier.wait()
            outcomes[name] = durableruns.decide(run_id, "notify_buyer", "happened", by=name,
                                                note=f"{name} saw it in the outbox",
                                                result={"message_id": f"msg_{message['id']}", "seen_by": name})
        except AlreadyDecided as exc:
            outcomes[name] = exc
        finally:
            connection.close()

    clerks = [threading.Thread(target=clerk, args=(name,)) for name in ("alice", "bob")]
    for t in clerks:
        t.start()
    for t in clerks:
        t.join(timeout=30)

    refused = [name for name, o in outcomes.items() if isinstance(o, AlreadyDecided)]
    assert len(outcomes) == 2 and len(refused) == 1, outcomes
    (winner,) = {"alice", "bob"} - set(refused)
    assert f"already decided by {winner}" in str(outcomes[refused[0]])
    decision = Intervention.objects.get()
    assert (decision.decided_by, decision.action) == (winner, "happened")
    assert Escalation.objects.open().count() == 0

    out = resume(workers, CURRENT)
    assert f"{run_id}: completed" in out, out
    assert attempts(run_id, "notify_buyer") == [(1, "completed", "decision")]
    assert (RunStep.objects.get(run_id=run_id, step="notify_buyer").result or {}).get("seen_by") == winner
    assert run(run_id).cursor == len(PLAN)
    assert far.email.count() == 1
