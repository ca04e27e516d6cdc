"""Fixtures of the API tests: users holding exactly one permission each, clients signed in by token, and runs
in the states the endpoints render (an open escalation, a completed run)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from durableruns import services
from durableruns.models import Escalation, RunState, RunStatus, RunStep, StepStatus
from durableruns.registry import effect_key, get_workflow
from tests.factories import complete, crash_after_intent, make_run

ClientFor = Callable[[User], APIClient]


@pytest.fixture(autouse=True)
def fast_passwords(settings: Any) -> None:
    """Hash test passwords cheaply: the default hasher costs a quarter second per user."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


READ = ("view_runstate", "view_escalation")


def user_with(username: str, *perms: str) -> User:
    """A staff member holding exactly `perms` ("view_runstate", "start_run", "decide_escalation", ...)."""
    user = User.objects.create_user(username=username, password="pw-" + username)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="durableruns", codename=codename))
    return user


@pytest.fixture
def outsider() -> User:
    """Signed in, holding none of the app's permissions."""
    return user_with("outsider")


@pytest.fixture
def reader() -> User:
    return user_with("reader", *READ)


@pytest.fixture
def starter() -> User:
    return user_with("starter", *READ, "start_run")


@pytest.fixture
def decider() -> User:
    return user_with("decider", *READ, "decide_escalation")


@pytest.fixture
def operator() -> User:
    """May cancel and retry runs."""
    return user_with("operator", *READ, "cancel_run", "retry_run")


@pytest.fixture
def superuser() -> User:
    return User.objects.create_superuser(username="root", password="pw-root", email="root@example.com")


@pytest.fixture
def client_for() -> ClientFor:
    """An APIClient that authenticates by token, as another system would."""

    def signed_in(user: User) -> APIClient:
        client = APIClient()
        token, _ = Token.objects.get_or_create(user=user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
        return client

    return signed_in


@pytest.fixture
def anonymous() -> APIClient:
    return APIClient()


def escalated_run(run_id: str | None = None) -> Escalation:
    """A scripted run whose `third` step (policy escalate) crashed after its intent: the engine escalates it."""
    run_id = make_run(run_id=run_id)
    complete(run_id, "first", {"ok": 1})
    complete(run_id, "second", {"ok": 2})
    crash_after_intent(run_id, "third", cursor=2)
    services.resume_due(run_id=run_id)
    return Escalation.objects.get(run_id=run_id)


def bulk_runs(n: int, *, start: int = 0, escalate: bool = False) -> list[str]:
    """Insert `n` scripted runs quickly, each with `first` done and `second` in doubt (and, with `escalate`,
    `third` in doubt and escalated): enough rows to show that a page's queries do not grow with them."""
    now = timezone.now()
    fingerprint = get_workflow("scripted").fingerprint
    ids = [f"bulk-{i:05d}" for i in range(start, start + n)]
    RunState.objects.bulk_create(
        RunState(
            run_id=run_id,
            workflow="scripted",
            plan_fingerprint=fingerprint,
            input={"n": i},
            status=RunStatus.NEEDS_DECISION if escalate else RunStatus.WAITING,
            cursor=1,
            created_at=now - timedelta(seconds=i),
            updated_at=now,
        )
        for i, run_id in enumerate(ids, start)
    )
    steps = []
    for run_id in ids:
        steps.append(
            RunStep(
                run_id=run_id,
                step="first",
                attempt=1,
                status=StepStatus.COMPLETED,
                effect_key=effect_key(run_id, "first"),
                started_at=now,
                finished_at=now,
                result={},
            )
        )
        steps.append(
            RunStep(
                run_id=run_id,
                step="second",
                attempt=1,
                status=StepStatus.STARTED,
                effect_key=effect_key(run_id, "second"),
                started_at=now,
            )
        )
        if escalate:
            steps.append(
                RunStep(
                    run_id=run_id,
                    step="third",
                    attempt=1,
                    status=StepStatus.STARTED,
                    effect_key=effect_key(run_id, "third"),
                    started_at=now,
                )
            )
    RunStep.objects.bulk_create(steps)
    if escalate:
        Escalation.objects.bulk_create(
            Escalation(
                run_id=run_id,
                step="third",
                attempt=1,
                effect_key=effect_key(run_id, "third"),
                in_doubt_since=now,
                opened_at=now - timedelta(seconds=i),
                reason="nobody can look it up",
            )
            for i, run_id in enumerate(ids, start)
        )
    return ids
