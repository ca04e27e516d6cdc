"""The schedule worker processes of the schedule tests declare, from their environment (loaded through
DURABLERUNS_WORKFLOW_MODULES=tests.workflows,tests.timetable): TIMETABLE_CRON, and optionally TIMETABLE_NAME and
TIMETABLE_CATCH_UP. Without TIMETABLE_CRON it declares nothing."""

from __future__ import annotations

import os

import durableruns

if os.environ.get("TIMETABLE_CRON"):
    durableruns.schedule(
        os.environ.get("TIMETABLE_NAME", "every2s"),
        "ticked",
        os.environ["TIMETABLE_CRON"],
        catch_up=os.environ.get("TIMETABLE_CATCH_UP", "all"),
        input={"by": "timetable"},
    )
