"""Bulk acts by filter (durableruns.bulks), worked in-process against the real database: the runs a filter
matched frozen at once, each acted on later by a pass, in the commit that marks it done; a run that no longer
fits skipped with a reason; exactly one staff act per run, naming the bulk; the far systems' ledgers still one
charge per key after a bulk restart."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from durableruns import bulks, services
from durableruns.bulk_models import BulkItem
from durableruns.errors import InvalidDecision, InvalidInput
from durableruns.models import Escalation, Intervention, Resolution, RunState, RunStatus, RunStep
from tests.factories import complete, crash_after_intent, make_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_backoff(settings):
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0


def failed_runs(n: int, *, prefix: str = "f") -> list[str]:
    """`n` runs of `scripted` failed at `first` (refused three times)."""
    ids = [make_run("scripted", {"first": "reject"}, run_id=f"{prefix}-{i:03d}") for i in range(n)]
    services.resume_due()
    assert set(RunState.objects.filter(pk__in=ids).values_list("status", flat=True)) == {RunStatus.FAILED}
    return ids


def acts(bulk_id: str) -> list[tuple[str, str, str, str]]:
    return sorted(Intervention.objects.filter(bulk_id=bulk_id).values_list("run_id", "action", "decided_by", "note"))


def test_a_bulk_records_its_runs_at_once_and_acts_on_none_in_the_request():
    waiting = [make_run("scripted", run_id=f"w-{i}") for i in range(5)]
    other = make_run("order", run_id="not-scripted")
    bulk_id, total = bulks.start_bulk("cancel", {"workflow": "scripted"}, by="ops", note="outage")
    assert total == 5
    assert sorted(BulkItem.objects.filter(bulk_id=bulk_id).values_list("run_id", flat=True)) == sorted(waiting)
    assert set(RunState.objects.values_list("status", flat=True)) == {RunStatus.PENDING}  # nothing acted on yet
    assert not Intervention.objects.exists()
    progress = bulks.progress(bulk_id)
    assert (progress.state, progress.total, progress.done, progress.failed) == ("running", 5, 0, [])
    # a run matching the filter started after the bulk is not its: the set was frozen
    late = make_run("scripted", run_id="late")
    assert bulks.drain() == 5
    assert {r: s for r, s in RunState.objects.values_list("run_id", "status")} == {
        **{r: RunStatus.CANCELLED for r in waiting}, other: RunStatus.PENDING, late: RunStatus.PENDING}
    assert acts(bulk_id) == [(r, "cancel", "ops", "outage") for r in sorted(waiting)]
    progress = bulks.progress(bulk_id)
    assert (progress.state, progress.total, progress.done, progress.failed) == ("finished", 5, 5, [])


def test_a_bulk_retry_gives_each_failed_run_fresh_attempts_and_skips_what_no_longer_fits():
    ids = failed_runs(4)
    bulk_id, total = bulks.start_bulk("retry", {"workflow": "scripted", "status": "failed"}, by="ops",
                                      note="carrier back")
    assert total == 4
    services.cancel_run(ids[0], by="someone", note="given up on")  # no longer failed: no longer fits the filter
    assert bulks.drain() == 4
    retried = ids[1:]
    assert acts(bulk_id) == [(r, "retry", "ops", "carrier back") for r in retried]
    assert set(RunState.objects.filter(pk__in=retried).values_list("status", flat=True)) == {RunStatus.PENDING}
    progress = bulks.progress(bulk_id)
    assert progress.state == "finished" and progress.done == 4
    assert progress.failed == [(ids[0], "it no longer matches the bulk's filter")]
    # a retried run goes on: `first` gets a fresh count of attempts
    assert Intervention.objects.get(run_id=ids[1], bulk_id=bulk_id).step == "first"


def test_a_run_failing_the_acts_precondition_is_skipped_with_its_reason_and_the_others_go_on():
    ids = failed_runs(2)
    waiting = make_run("scripted", run_id="still-pending")
    bulk_id, total = bulks.start_bulk("retry", {"workflow": "scripted"}, by="ops", note="n")
    assert total == 3
    bulks.drain()
    progress = bulks.progress(bulk_id)
    assert progress.done == 3 and progress.failed == [
        (waiting, "only a failed or stopped run can be retried; this one is pending")]
    assert [a[0] for a in acts(bulk_id)] == sorted(ids)


def test_a_bulk_restart_keeps_the_keys_and_the_ledger_holds_one_charge_per_key(far):
    ids = [make_run("order", run_id=f"po-{i}") for i in range(3)]
    services.resume_due()
    assert far.payments.count() == 3 and far.carrier.count() == 3
    bulk_id, total = bulks.start_bulk("restart", {"workflow": "order", "status": "completed"}, by="ops",
                                      note="fix deployed", from_step="charge")
    assert total == 3
    assert bulks.drain() == 3
    new = dict(RunState.objects.filter(restarted_from__in=ids).values_list("restarted_from", "run_id"))
    assert sorted(new) == ids
    # one restart act on each source and on each new run, naming the bulk
    assert len(acts(bulk_id)) == 6 and {a[1] for a in acts(bulk_id)} == {"restart"}
    assert services.resume_due().counts() == {"completed": 3}
    for source, restarted in new.items():
        charge = RunStep.objects.get(run_id=restarted, step="charge")
        assert (charge.resolution, charge.effect_key) == (Resolution.LOOKUP, f"{source}:charge")
    assert far.payments.count() == 3 and far.carrier.count() == 3
    assert far.payments.duplicates() == {} and far.carrier.duplicates() == {}


def test_a_restart_from_the_failed_step_skips_a_run_with_none():
    ids = failed_runs(2)
    done = make_run("scripted", run_id="done")
    services.resume_due(run_id=done)
    bulk_id, total = bulks.start_bulk("restart", {"workflow": "scripted"}, by="ops", note="n",
                                      from_step=bulks.FAILED_STEP)
    assert total == 3
    bulks.drain()
    assert sorted(RunState.objects.filter(restarted_from__isnull=False).values_list("restarted_from", flat=True)) \
        == sorted(ids)
    assert set(RunState.objects.filter(restarted_from__isnull=False).values_list("restarted_step", flat=True)) == {
        "first"}
    assert bulks.progress(bulk_id).failed == [(done, "this run has no failed step to restart from; it is completed")]


def test_a_bulk_never_touches_a_run_its_author_cannot_see(settings):
    settings.DURABLERUNS_WORKFLOW_GROUPS = {"scripted": ["payroll"]}
    author = User.objects.create_user("ops")
    hidden = make_run("scripted", run_id="payroll-run")
    seen = make_run("order", run_id="order-run")
    bulk_id, total = bulks.start_bulk("cancel", {"status": "pending"}, by=author, note="n")
    assert total == 1
    bulks.drain()
    assert RunState.objects.get(pk=hidden).status == RunStatus.PENDING
    assert RunState.objects.get(pk=seen).status == RunStatus.CANCELLED
    # the scope is the author's when the act is made too: taken out of the group meanwhile, the run is skipped
    group = Group.objects.create(name="payroll")
    author.groups.add(group)
    another = make_run("scripted", run_id="payroll-2")
    bulk_id, total = bulks.start_bulk("cancel", {"workflow": "scripted"}, by=User.objects.get(pk=author.pk),
                                      note="n")
    assert total == 2
    author.groups.remove(group)
    bulks.drain()
    assert set(RunState.objects.filter(pk__in=[hidden, another]).values_list("status", flat=True)) == {
        RunStatus.PENDING}
    assert len(bulks.progress(bulk_id).failed) == 2


def test_bad_bulks_are_refused_and_record_nothing():
    make_run("scripted")
    with pytest.raises(InvalidInput, match="action must be one of"):
        bulks.start_bulk("delete", {"workflow": "scripted"}, by="ops", note="n")
    with pytest.raises(InvalidDecision, match="note"):
        bulks.start_bulk("cancel", {"workflow": "scripted"}, by="ops", note=" ")
    with pytest.raises(InvalidInput, match="needs from_step"):
        bulks.start_bulk("restart", {"workflow": "scripted"}, by="ops", note="n")
    with pytest.raises(InvalidInput, match="'nope' is not a step of scripted's plan"):
        bulks.start_bulk("restart", {"workflow": "scripted"}, by="ops", note="n", from_step="nope")
    assert not BulkItem.objects.exists()


def escalated(run_id: str) -> int:
    make_run(run_id=run_id)
    complete(run_id, "first", {"ok": 1})
    complete(run_id, "second", {"ok": 2})
    crash_after_intent(run_id, "third", cursor=2)
    services.resume_due(run_id=run_id)
    return Escalation.objects.get(run_id=run_id).pk


def test_a_decision_in_bulk_decides_each_selected_escalation_once():
    chosen = [escalated(f"e-{i}") for i in range(3)]
    left = escalated("e-left")
    services.resolve_escalation(chosen[0], "abandon", by="first", note="decided alone")
    bulk_id, total = bulks.decide_in_bulk(chosen, "did_not_happen", by="ops", note="checked the outbox")
    assert total == 2  # an escalation decided already is not taken
    bulks.drain()
    assert acts(bulk_id) == [("e-1", "did_not_happen", "ops", "checked the outbox"),
                             ("e-2", "did_not_happen", "ops", "checked the outbox")]
    assert set(RunState.objects.filter(pk__in=["e-1", "e-2"]).values_list("status", flat=True)) == {
        RunStatus.PENDING}
    assert not Intervention.objects.filter(escalation_id=left).exists()
    with pytest.raises(InvalidDecision):
        bulks.decide_in_bulk([left], "maybe", by="ops", note="n")


def test_an_escalation_decided_after_the_bulk_was_asked_is_skipped_naming_who_decided_it():
    chosen = [escalated(f"e-{i}") for i in range(2)]
    bulk_id, total = bulks.decide_in_bulk(chosen, "abandon", by="ops", note="nobody will check")
    assert total == 2
    services.resolve_escalation(chosen[0], "happened", by="bea", note="found it in the outbox")
    bulks.drain()
    (skipped,) = bulks.progress(bulk_id).failed
    assert skipped[0] == "e-0" and skipped[1].startswith("already decided by bea at ")
    assert Intervention.objects.get(escalation_id=chosen[0]).decided_by == "bea"  # one decision, the first
    assert Intervention.objects.get(escalation_id=chosen[1]).bulk_id == bulk_id
    assert RunState.objects.get(pk="e-1").status == RunStatus.CANCELLED
