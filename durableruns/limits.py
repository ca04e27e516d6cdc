"""Concurrency limits: what the record says of a run held back by its workflow's limit. No database.

A limited workflow (`Workflow(name, concurrency=, concurrency_key=)`) lets at most its limit of runs hold a lease
at once, per key; each run records its key when it starts. The claim enforces the limit and parks the runs it
refuses (durableruns.store.claims on PostgreSQL, the ORM claim's filter elsewhere).
"""

from __future__ import annotations

# The reason of a run parked by its concurrency limit: waiting with no wake time, holding nothing, until a run of
# its (workflow, key) leaves running and lets the first parked one go. A partial index (run_state_limit_parked_idx)
# holds exactly these runs, so the text is spelled in the migration that built it: change both or neither.
PARKED = "parked: its concurrency limit is reached"
