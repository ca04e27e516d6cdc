"""resume_runs when the worker's database connection is closed under it: Django's InterfaceError, which is not a
DatabaseError, stops the pass like any database error (a clear message, exit status 1), at every concurrency,
and leaves the record as a crash would."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from durableruns import testing
from durableruns.models import RunState, RunStatus, RunStep
from tests.conftest import CITUS_LANE
from tests.factories import make_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.skipif(
        CITUS_LANE,
        reason="closes the single-node hot path's prepared cursor, which a distributed record does not use",
    ),
]


def close_the_workers_cursor(point: str, step: str) -> None:
    """Once `first` has returned: close the prepared cursor of the worker thread's connection (the store's hot path,
    which writes the record), so its next statement meets psycopg's "the cursor is closed" (InterfaceError)."""
    if (point, step) == ("after_return", "first"):
        connection.durableruns_hot_path.cursor.close()


@pytest.mark.parametrize("concurrency", ["1", "2"])
def test_a_connection_closed_under_the_worker_stops_the_pass_with_a_clear_message(concurrency):
    run_id = make_run("scripted")
    testing.arm(close_the_workers_cursor)
    err = StringIO()
    try:
        with pytest.raises(CommandError) as caught:
            call_command("resume_runs", "--once", "--concurrency", concurrency, stdout=StringIO(), stderr=err)
    finally:
        testing.arm(None)
    assert caught.value.returncode == 1, caught.value
    message = str(caught.value)
    assert message.startswith("database error, pass stopped: the database connection was closed"), message
    assert "the cursor is closed" in message and "the next pass resumes from the record" in message
    assert "raised" not in err.getvalue()  # the database's health, not one run's trouble: no run is set aside
    # As after a crash: `first` ran and its result is not recorded (in doubt), nothing is marked failed.
    assert list(RunStep.objects.filter(run_id=run_id).values_list("step", "status")) == [("first", "started")]
    assert RunState.objects.get(pk=run_id).status == RunStatus.RUNNING
