"""What tests/site/test_two_databases.py does inside the two-database site (tests.site.two_databases), one process
per call: `python -m tests.site.two_databases_steps STEP...` (migrate, start, staff, start_later), in the order
given. It prints one JSON object, what each step found under its name, for the test to read back; the databases
themselves are inspected by the test from outside.
"""

from __future__ import annotations

import json
import sys
from typing import Any


class Rollback(Exception):
    """Raised to roll a caller's transaction back."""


def migrate() -> dict[str, Any]:
    """Migrate the site as its deploy does: `migrate`, then `migrate --database runs`."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("migrate", database="runs", verbosity=0)
    return {}


def start() -> dict[str, Any]:
    """Start the runs the worker is to complete (one of them escalates), then start() inside a caller's
    transaction on "runs" (one commit with the caller's order) and inside one on "default" only (two databases:
    the run is committed on its own); and run the checks as set up, without the router, and with an unknown alias."""
    from django.contrib.auth.models import User
    from django.core import checks
    from django.db import connections, transaction
    from django.test import override_settings

    import durableruns
    from durableruns.models import RunState

    durableruns.start("scripted", {}, run_id="plain-1")
    durableruns.start("scripted", {"third": "boom"}, run_id="escalates-1")  # an escalate step raising: in doubt

    orders = connections["runs"]
    with orders.cursor() as cursor:  # the caller's own records, in the runs' database
        cursor.execute("CREATE TABLE site_order (id text PRIMARY KEY)")

    def order(order_id: str) -> None:
        with orders.cursor() as cursor:
            cursor.execute("INSERT INTO site_order (id) VALUES (%s)", [order_id])

    try:
        with transaction.atomic(using="runs"):
            order("order-rolled-back")
            durableruns.start("scripted", {}, run_id="in-runs-rolled-back")
            raise Rollback
    except Rollback:
        pass
    with transaction.atomic(using="runs"):
        order("order-committed")
        durableruns.start("scripted", {}, run_id="in-runs-committed")
    try:
        with transaction.atomic():  # "default" only: the run is not part of this transaction
            User.objects.create(username="rolled-back")
            durableruns.start("scripted", {}, run_id="in-default-rolled-back")
            raise Rollback
    except Rollback:
        pass
    with orders.cursor() as cursor:
        cursor.execute("SELECT id FROM site_order ORDER BY id")
        committed_orders = [row[0] for row in cursor.fetchall()]

    def ours() -> list[str]:
        return sorted({m.id for m in checks.run_checks(tags=["durableruns"]) if m.id.startswith("durableruns.")})

    found_checks = {"as_set_up": ours()}
    with override_settings(DATABASE_ROUTERS=[]):
        found_checks["without_the_router"] = ours()
    with override_settings(DURABLERUNS_DATABASE="elsewhere"):
        found_checks["an_unknown_alias"] = ours()
    return {
        "runs": sorted(RunState.objects.values_list("run_id", flat=True)),
        "orders": committed_orders,
        "users": sorted(User.objects.values_list("username", flat=True)),
        "checks": found_checks,
    }


def staff() -> dict[str, Any]:
    """After the worker: a staff member (in "default") reads the admin's and the API's pages of the runs (in
    "runs"), cancels a run and decides the escalation through the API; then the user is deleted."""
    from django.contrib.auth.models import User
    from django.test import Client

    import durableruns
    from durableruns.models import Escalation, Intervention, RunState

    user = User.objects.create_superuser("root", "root@example.com", None)
    client = Client()
    client.force_login(user)
    durableruns.start("scripted", {}, run_id="cancel-me")
    escalation = Escalation.objects.get(run_id="escalates-1")
    pages = {}
    for url in [
        "/admin/durableruns/runstate/",
        "/admin/durableruns/runstate/plain-1/change/",
        "/admin/durableruns/escalation/",
        f"/admin/durableruns/escalation/{escalation.pk}/change/",
        "/api/runs/",
        "/api/runs/plain-1/",
        "/api/escalations/",
    ]:
        page = client.get(url)
        pages[url] = {
            "status": page.status_code,
            "names_a_run": "plain-1" in page.content.decode() or "escalates-1" in page.content.decode(),
        }
    cancel = client.post("/api/runs/cancel-me/cancel/", {"note": "not wanted"}, content_type="application/json")
    decide = client.post(
        f"/api/escalations/{escalation.pk}/decide/",
        {"outcome": "happened", "note": "seen in the far system", "result": {"sent": True}},
        content_type="application/json",
    )
    decision = Intervention.objects.get(escalation=escalation)
    decided_by_user = decision.user.username if decision.user else None  # read from "default"
    User.objects.filter(pk=user.pk).delete()  # the site's users are not where the interventions are
    return {
        "pages": pages,
        "cancel": cancel.status_code,
        "decide": decide.status_code,
        "decided_by_user": decided_by_user,
        "statuses": dict(RunState.objects.filter(pk__in=["cancel-me", "escalates-1"]).values_list("run_id", "status")),
        "interventions": sorted(Intervention.objects.values_list("action", "user_id")),
        "user_id": user.pk,
    }


def start_later() -> dict[str, Any]:
    """Start one more run, for a --loop worker already listening (its pickup comes from this commit's NOTIFY)."""
    import durableruns

    return {"run_id": durableruns.start("scripted", {}, run_id="loop-1")}


if __name__ == "__main__":
    import django

    django.setup()
    steps = {"migrate": migrate, "start": start, "staff": staff, "start_later": start_later}
    print(json.dumps({name: steps[name]() for name in sys.argv[1:]}))
