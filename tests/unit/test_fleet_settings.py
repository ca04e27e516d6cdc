"""A database that is a fleet: when a failover could lose an acknowledged commit (a table), and the settings for
standbys and poolers that the system checks reject."""

from __future__ import annotations

import pytest
from django.core import checks
from django.test import override_settings

from durableruns.checks import check_standby_intents
from durableruns.ops.replication import Replication

ASYNC = (("standby1", "async"),)
SYNC = (("standby1", "sync"),)


@pytest.mark.parametrize(("commit", "names", "standbys", "intents", "warned"), [
    ("on", "", (), None, False),  # no standby: a failover has nothing to promote
    ("on", "", ASYNC, None, True),  # asynchronous streaming: the default of most managed services
    ("on", "", ASYNC, "on", True),  # the setting cannot wait for a standby nobody names
    ("on", "standby1", SYNC, None, False),
    ("on", "ANY 1 (standby1, standby2)", (("standby1", "quorum"), ("standby2", "quorum")), None, False),
    ("local", "standby1", SYNC, None, True),  # named, but commits do not wait
    ("off", "standby1", SYNC, None, True),
    ("local", "standby1", SYNC, "on", False),  # the steps with no key or lookup wait; the rest have a key or lookup
    ("remote_apply", "standby1", SYNC, None, False),
])
def test_a_warning_exactly_when_an_acknowledged_commit_could_be_lost(commit, names, standbys, intents, warned):
    risk = Replication(synchronous_commit=commit, synchronous_standby_names=names, standbys=standbys,
                       standby_intents=intents).risk()
    assert (risk is not None) is warned
    if risk:
        assert risk.startswith("a failover could lose acknowledged commits") and "Fix:" in risk
        assert "standby1" in risk


@pytest.mark.parametrize(("value", "ok"), [(None, True), ("on", True), ("remote_write", True),
                                           ("remote_apply", True), ("local", False), ("yes", False)])
def test_the_standby_intents_setting_is_checked_at_start(value, ok):
    with override_settings(DURABLERUNS_STANDBY_INTENTS=value):
        found = check_standby_intents()
    assert (found == []) is ok
    if not ok:
        assert [(m.level, m.id) for m in found] == [(checks.ERROR, "durableruns.E005")]


def test_the_listen_database_must_be_an_alias_of_the_site():
    from durableruns.checks import check_listen_database

    assert check_listen_database() == []  # the default: the runs' own alias
    with override_settings(DURABLERUNS_LISTEN_DATABASE="direct"):
        assert [m.id for m in check_listen_database()] == ["durableruns.E006"]


def test_the_runs_database_must_be_an_alias_of_the_site_and_routed_there():
    from durableruns.checks import check_own_database

    assert check_own_database() == []  # the default: "default", no router needed
    with override_settings(DURABLERUNS_DATABASE="runs"):
        assert [m.id for m in check_own_database()] == ["durableruns.E007"]
