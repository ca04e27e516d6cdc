"""Who an approval or an escalation is assigned to, asked once as its inbox item opens (durableruns.inbox): the
step's `assign_to` (a group's name, or a function of ctx returning one), else DURABLERUNS_DEFAULT_ASSIGNEE, else
nobody in particular (everyone with the permission). The answer is recorded with the item; nothing asks again."""

from __future__ import annotations

import logging
from collections.abc import Callable

from durableruns import conf
from durableruns.context import StepContext
from durableruns.steps import Step
from durableruns.store.inbox import Opening

log = logging.getLogger("durableruns")

GROUP_LIMIT = 150  # the record's column


def opening(step: Step, context: Callable[[], StepContext]) -> Opening:
    """The item's opening for `step`: its group asked now (a function of ctx raising, or answering nothing, is
    logged and leaves the default assignee), its due time and the group it moves to."""
    group = step.assign_to
    if callable(group):
        try:
            group = group(context())
        except Exception:  # users' code: the item still opens, for the default assignee, and the error is logged
            log.exception("%s: assign_to raised; the item goes to the default assignee", step.name)
            group = None
    name = str(group).strip() if group is not None else ""
    if len(name) > GROUP_LIMIT:
        log.error(
            "%s: assign_to answered a %s-character group name; the item goes to the default assignee",
            step.name,
            len(name),
        )
        name = ""
    return Opening(group=name or conf.default_assignee(), due=step.due, escalate_to=step.escalate_to)
