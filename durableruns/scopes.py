"""Who sees which runs: a workflow named in DURABLERUNS_WORKFLOW_GROUPS is seen, and acted on, only by superusers
and the members of its groups (durableruns.conf.workflow_groups). Every edge that lists, counts, searches or opens
runs asks here; the model permissions still decide what a user who sees a run may do with it.

A run out of a user's scope does not exist for them: it is in no list or count, and its page and API detail are
404, as a run that was never recorded, so that its id, its workflow and its input say nothing.
"""

from __future__ import annotations

from typing import Any

from durableruns import conf

# A user's group names are read once per request: the user object of a request lives as long as it does.
_GROUPS_ATTRIBUTE = "_durableruns_group_names"


def group_names(user: Any) -> frozenset[str]:
    """The names of the groups `user` is a member of (none for an anonymous user), read once per request."""
    if user is None or not getattr(user, "is_authenticated", False):
        return frozenset()
    names = getattr(user, _GROUPS_ATTRIBUTE, None)
    if names is None:
        names = frozenset(user.groups.values_list("name", flat=True))
        try:
            setattr(user, _GROUPS_ATTRIBUTE, names)
        except AttributeError:  # an object that takes no attribute: read again next time
            pass
    return names


def hidden_workflows(user: Any) -> frozenset[str]:
    """The workflows `user` may not see: those scoped to groups none of which the user is a member of. Empty for
    a superuser, and on a site that scopes nothing; every scoped workflow for an anonymous user."""
    scoped = conf.workflow_groups()
    if not scoped or getattr(user, "is_superuser", False):
        return frozenset()
    if user is None or not getattr(user, "is_authenticated", False):
        return frozenset(scoped)
    mine = group_names(user)
    return frozenset(workflow for workflow, groups in scoped.items() if not groups & mine)


def may_see(user: Any, workflow: str) -> bool:
    """Whether `user` sees runs of `workflow`."""
    return workflow not in hidden_workflows(user)
