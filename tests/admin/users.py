"""Staff users holding exactly the back-office permissions a test needs, and clients logged in as them."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Permission, User
from django.test import Client

VIEW = ("view_runstate", "view_escalation")
OPERATE = (*VIEW, "cancel_run", "retry_run", "decide_escalation")


def staff(username: str, *codenames: str) -> User:
    """A staff user holding exactly these durableruns permissions; the password is pw-<username>-9f3."""
    user = User.objects.create_user(username, password=f"pw-{username}-9f3", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="durableruns", codename__in=codenames))
    return user


def logged_in(user: User, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client
