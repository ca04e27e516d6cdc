"""The PostgreSQL hot path: its statements are prepared, planned afresh at each execution, and can be turned off.

Planning at each execution matters: a generic plan cached while the tables are small scans them sequentially
for as long as the worker lives, however much they grow.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import durableruns
from durableruns import services
from durableruns.models import RunState, RunStatus

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def prepared_statements() -> dict[str, tuple[int, int]]:
    """This session's prepared statements: text -> (generic plans, custom plans) so far."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        return {" ".join(text.split()): (generic, custom) for text, generic, custom in cursor.fetchall()}


def run_to_completion(count: int) -> list[str]:
    run_ids = [durableruns.start("scripted", {}) for _ in range(count)]
    report = services.resume_due(limit=count)
    assert [o.status for o in report.outcomes] == [RunStatus.COMPLETED] * count
    return run_ids


def test_the_hot_path_prepares_its_statements_and_plans_every_execution():
    run_to_completion(8)  # more executions than PostgreSQL's 5 custom plans before it tries a generic one
    statements = prepared_statements()
    claims = [s for s in statements if s.startswith("UPDATE run_state SET status = 'running'")]
    facts = [s for s in statements if s.startswith("WITH fence AS")]
    assert claims and facts, statements
    # Only the hot path's statements: Django's own queries keep its client-side binding.
    assert len(claims) + len(facts) == len(statements), statements
    assert sum(custom for _, custom in statements.values()) >= 8 * 5  # claim, first intent, 3 results
    assert all(generic == 0 for generic, _ in statements.values()), statements


def test_with_the_setting_off_nothing_is_prepared(settings):
    run_to_completion(1)
    before = prepared_statements()
    settings.DURABLERUNS_PREPARED_STATEMENTS = False
    run_ids = run_to_completion(3)
    assert prepared_statements() == before  # not one more execution of a prepared statement
    assert RunState.objects.filter(pk__in=run_ids, status=RunStatus.COMPLETED, cursor=3).count() == 3


def test_where_django_logs_queries_the_statements_are_logged_with_their_values():
    with CaptureQueriesContext(connection) as captured:
        [run_id] = run_to_completion(1)
    logged = [q["sql"] for q in captured.captured_queries]
    assert all(isinstance(sql, str) and sql for sql in logged), logged
    facts = [sql for sql in logged if sql.lstrip().startswith("WITH fence AS")]  # first intent, 3 results
    assert len(facts) == 4 and all(f"'{run_id}'" in sql for sql in facts), facts


def test_plans_are_made_afresh_even_where_the_connection_already_prepares():
    connection.close()
    connection.ensure_connection()
    connection.connection.prepare_threshold = 5  # as OPTIONS {"prepare_threshold": 5} would set it
    run_to_completion(8)
    with connection.cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        assert cursor.fetchone()[0] == "force_custom_plan"
    statements = prepared_statements()
    assert statements and all(generic == 0 for generic, _ in statements.values()), statements
    assert connection.connection.prepare_threshold == 5  # the deployment's own choice is left as it was
