"""Fixtures of the back-office tests: staff with and without permissions, logged-in clients, no retry backoff."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.admin.users import OPERATE, VIEW, logged_in, staff


@pytest.fixture(autouse=True)
def no_backoff(settings):
    """Failed attempts are retried at once, so a run fails (or recovers) within one resume pass."""
    settings.DURABLERUNS_RETRY_BACKOFF_SECONDS = 0


@pytest.fixture
def viewer() -> User:
    """Staff who may look at runs and escalations, and do nothing else."""
    return staff("viola", *VIEW)


@pytest.fixture
def operator() -> User:
    """Staff who may decide escalations, cancel and retry runs."""
    return staff("alice", *OPERATE)


@pytest.fixture
def as_viewer(viewer: User) -> Client:
    return logged_in(viewer)


@pytest.fixture
def as_operator(operator: User) -> Client:
    return logged_in(operator)
