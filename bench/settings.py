"""The demo site's settings, plus what the benchmarks switch per worker process from the environment.

The pickup figure runs one `--loop` worker listening and one polling only (DURABLERUNS_LISTEN=0, as a worker
does while its listening connection is lost); both use this module, so nothing else differs between them.
"""

from __future__ import annotations

import os

from project.settings import *  # noqa: F403

DURABLERUNS_LISTEN = os.environ.get("DURABLERUNS_LISTEN", "1").strip().lower() not in ("0", "false", "off", "no")

# The demo site's nightly schedule is not part of what the benchmarks measure (a --loop worker would keep a
# timetable thread for it, and every pass would look at it).
PURCHASING_RECONCILIATION_CRON = ""
