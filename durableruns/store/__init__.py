"""The only writer of the record. One durable transaction per fact, each fenced on the run's epoch; on PostgreSQL
the hot path's facts are one statement each, kept beside the function that sends it.

Callers write `from durableruns import store; store.record_intent(...)`: this face re-exports each module's
public names. One module a concept, each below the ones that use it:

    sql          the PostgreSQL hot path they share: the prepared cursor (HotPath, hot_path), one(), rowcount(),
                 a commit that waits for a standby, through_a_proxy(), the wake-up channel (WAKE_CHANNEL)
    base         Lease, Claimed, Intent, the DATABASE clock, ENDED, and the helpers every write begins with:
                 fast(), fence(), finish_attempt(), lease_times(), wake_workers()
                 (to_json, ensure_json, storable: durableruns.encoding, below the store; re-exported here)
    plans        record_plan, plan_of, forget_plans
    inbox        Opening, open_item (inside the commit that opens an approval's wait or an escalation),
                 guard_decision (inside the decision's), take_item, release_item, remind, move: the inbox's items
    attributes   write_attributes, write_many: a run's attributes, inside the commit that creates the run or
                 records a step's result (used by children, runs and attempts below; not re-exported)
    children     NewChild, child_exists, start_child; a child's end waking its parent's join (wake_parent)
    runs         create_run, renew, renew_all, release, begin_ending, end, let_go, reopen_runnable, reopen_runs,
                 await_end, forget_waiter (durableruns.result's waiters, whose runs' ends notify)
    debounce     debounce_run: a start with a key that replaces the run of that key not begun, DEBOUNCED
    claims       claim and its statements (the probes, concurrency limits, a fresh run's first intent), and what
                 a thread's last claim read: next_due_from_last_claim, more_due_after_last_claim, NEXT_DUE
    prefetch     claim_several, hand_back, prefetches: several due runs a claim for a single pass, and a run it
                 hands back not begun (used by durableruns.worker.prefetch; not re-exported)
    attempts     record_intent, record_result (with results held for it), record_held, record_failure, checkpoint,
                 record_raised
    progress     record_progress, reporter (ctx.progress: a step's latest message, done, total)
    waits        wait, complete_wait, now_and_oldest_event, record_event, record_approval, APPROVAL_ACTIONS
    staff        open_escalation, record_decision, record_staff_action (a cancel with its descendants), adopt_plan
    rates        take_turn, turn_of, waiting_turns: a step's rate limit (its turn, or the time it waits for)
    schedules    schedule_marks, start_slots
    marks        alert marks, a worker's presence, measuring's scratch runs, delete_runs (retention)
    bulks        create_bulk, act_on_pending, bulk_progress: a bulk act's items, frozen by one INSERT ... SELECT and
                 each acted on in the commit that marks it done (used by durableruns.bulks; not re-exported)
    deadlines    end_at_deadline (a system act, as a staff cancel), overdue_of, unclaimable_overdue, and the
                 alerts' marks of the runs a deadline ended (ended_at_deadline_unmailed, take_deadline_alert_mark)

A module imports only the ones listed above it (and never this face): the store has no circle of its own.
"""

from __future__ import annotations

from durableruns.encoding import TEXT_LIMIT, ensure_json, storable, to_json
from durableruns.store.attempts import (
    checkpoint,
    record_failure,
    record_held,
    record_intent,
    record_raised,
    record_result,
)
from durableruns.store.base import (
    DATABASE,
    DEFERRED,
    ENDED,
    Claimed,
    Intent,
    Lease,
    wake_workers,
)
from durableruns.store.children import UNFINISHED, NewChild, child_exists, start_child
from durableruns.store.claims import claim, more_due_after_last_claim, next_due_from_last_claim, parked_by_last_claim
from durableruns.store.deadlines import (
    Ended,
    Overdue,
    end_at_deadline,
    ended_at_deadline_unmailed,
    overdue_of,
    take_deadline_alert_mark,
    unclaimable_overdue,
)
from durableruns.store.debounce import DEBOUNCED, debounce_run
from durableruns.store.inbox import (
    Opening,
    close_stale,
    due_to_move,
    due_to_remind,
    give_reminder_back,
    move,
    release_item,
    remind,
    take_item,
)
from durableruns.store.marks import (
    SCRATCH_WORKFLOW,
    delete_runs,
    delete_scratch_run,
    give_alert_mark_back,
    give_run_alert_mark_back,
    report_presence,
    take_alert_mark,
    take_run_alert_mark,
)
from durableruns.store.plans import forget_plans, plan_of, record_plan
from durableruns.store.progress import record_progress, reporter
from durableruns.store.rates import take_turn, turn_of, waiting_turns
from durableruns.store.runs import (
    await_end,
    begin_ending,
    create_run,
    end,
    forget_waiter,
    let_go,
    release,
    renew,
    renew_all,
    reopen_runnable,
    reopen_runs,
)
from durableruns.store.schedules import schedule_marks, start_slots
from durableruns.store.staff import adopt_plan, open_escalation, record_decision, record_staff_action
from durableruns.store.waits import (
    APPROVAL_ACTIONS,
    complete_wait,
    now_and_oldest_event,
    record_approval,
    record_event,
    wait,
)

__all__ = [
    "Ended",
    "Overdue",
    "end_at_deadline",
    "ended_at_deadline_unmailed",
    "take_deadline_alert_mark",
    "overdue_of",
    "unclaimable_overdue",
    "APPROVAL_ACTIONS",
    "DATABASE",
    "DEFERRED",
    "DEBOUNCED",
    "debounce_run",
    "ENDED",
    "SCRATCH_WORKFLOW",
    "TEXT_LIMIT",
    "UNFINISHED",
    "Claimed",
    "Intent",
    "Lease",
    "NewChild",
    "adopt_plan",
    "await_end",
    "begin_ending",
    "checkpoint",
    "child_exists",
    "claim",
    "complete_wait",
    "create_run",
    "delete_runs",
    "delete_scratch_run",
    "end",
    "let_go",
    "ensure_json",
    "forget_plans",
    "forget_waiter",
    "give_alert_mark_back",
    "give_run_alert_mark_back",
    "more_due_after_last_claim",
    "next_due_from_last_claim",
    "now_and_oldest_event",
    "open_escalation",
    "Opening",
    "close_stale",
    "due_to_move",
    "due_to_remind",
    "give_reminder_back",
    "move",
    "release_item",
    "remind",
    "take_item",
    "parked_by_last_claim",
    "plan_of",
    "record_approval",
    "record_decision",
    "record_event",
    "record_failure",
    "record_held",
    "record_intent",
    "record_plan",
    "record_progress",
    "reporter",
    "record_raised",
    "record_result",
    "record_staff_action",
    "release",
    "renew",
    "renew_all",
    "reopen_runnable",
    "reopen_runs",
    "report_presence",
    "schedule_marks",
    "start_child",
    "start_slots",
    "storable",
    "take_turn",
    "take_alert_mark",
    "take_run_alert_mark",
    "to_json",
    "turn_of",
    "wait",
    "waiting_turns",
    "wake_workers",
]
