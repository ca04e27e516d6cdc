"""tests/citus runs in the Citus lane only (python -m tests.citus.lane): elsewhere there is no cluster to test."""

import os

if os.environ.get("DURABLERUNS_TEST_CITUS") != "1":
    collect_ignore_glob = ["test_*.py"]
