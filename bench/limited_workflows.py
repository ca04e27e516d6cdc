"""A workflow with a concurrency limit, for bench.citus's figure of what a deploy with limits pays per claim.

In a module of its own: a deploy that declares any limit claims through the limits' path for every run, so the
other benchmarks (bench.workflows) must not see it. A worker or timing process imports it through
DURABLERUNS_WORKFLOW_MODULES=bench.workflows,bench.limited_workflows.
"""

from __future__ import annotations

from typing import Any

from durableruns import Workflow

# One run at a time per key (concurrency_key with no concurrency=): the bench gives each run a key of its own, so
# every claim is admitted, after the key's lock and its count.
limited = Workflow("bench_limited", concurrency_key=lambda input: input["key"])


@limited.step(policy="re_executable")
def limited_step(ctx: Any) -> None:
    return None
