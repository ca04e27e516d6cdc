"""The back office: runs read-only with their recovery boundary, two confirmed staff actions, the escalation queue.

Pages read through the querysets and `services.boundary_of`; every write is one `services` call whose typed
error becomes a message. The record itself is never edited here: run_state has no change form, run_step (a
composite primary key, which the admin cannot register) is shown on the run page, and a decision is its own
row, made by `services.resolve_escalation`.

One module a page family, each registering its ModelAdmin when imported (Django's autodiscover imports this
package, which imports them):

    runs          the runs' list and filters, a run's page, cancel and retry, the approval queue (RunStateAdmin)
    escalations   the escalation queue and its decisions (EscalationAdmin)
    inbox         the person's inbox of approvals and escalations (InboxAdmin), the approval queue's entry
    schedules     the schedules' page (ScheduleAdmin)

and below them what they share: display (badges, summaries, holdings, a run's family and sentence), forms (the
note, the decision, the approval) and base (read-only admins, prefetching change lists, the capped paginator).
"""

from __future__ import annotations

from durableruns.admin.base import CappedCountPaginator, ReadOnlyRecord
from durableruns.admin.display import (
    ATTEMPT_BADGES,
    STATUS_TONES,
    ZONE_BADGES,
    pretty_json,
    status_badge,
    summarize,
    zone_badge,
    zone_detail,
)
from durableruns.admin.escalations import EscalationAdmin
from durableruns.admin.forms import DECISION_LABELS, nesting_depth
from durableruns.admin.inbox import ApprovalQueueAdmin, InboxAdmin
from durableruns.admin.runs import RunStateAdmin
from durableruns.admin.schedules import ScheduleAdmin

__all__ = [
    "ATTEMPT_BADGES",
    "DECISION_LABELS",
    "STATUS_TONES",
    "ZONE_BADGES",
    "CappedCountPaginator",
    "EscalationAdmin",
    "ApprovalQueueAdmin",
    "InboxAdmin",
    "ReadOnlyRecord",
    "RunStateAdmin",
    "ScheduleAdmin",
    "nesting_depth",
    "pretty_json",
    "status_badge",
    "summarize",
    "zone_badge",
    "zone_detail",
]
