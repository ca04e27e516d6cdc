"""Deploys of one small workflow, `parcel`, for the tests of runs in flight while the code changes.

`declare(version)` declares `parcel` as that deploy has it (Workflow(replace=True): each deploy replaces the
one before, in whichever process loads it). A worker process loads this module (DURABLERUNS_WORKFLOW_MODULES)
with PARCEL_DEPLOY naming its deploy; the test process calls declare() itself to start runs under a plan.

Every step writes one line to the ledger (PARCEL_LEDGER, a directory: one file per effect, named by its key,
so a second effect under the same key is seen as a second line), and resolvable steps look their effect up
there by key, as a far system that honours keys would answer.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from durableruns import Workflow

PACK, LABEL, SHIP = ("pack", "re_executable"), ("label", "resolvable"), ("ship", "resolvable")
VERSIONS: dict[str, list[tuple[str, str]]] = {
    "v1": [PACK, LABEL, SHIP],
    "append": [PACK, LABEL, SHIP, ("notify", "re_executable")],
    "swap": [PACK, SHIP, LABEL],
    "insert": [PACK, ("weigh", "re_executable"), LABEL, SHIP],
    "remove": [PACK, SHIP],  # label removed (or renamed, which is the same to a run that still needs it)
    "repolicy": [PACK, ("label", "escalate"), SHIP],
}


def _ledger() -> Path:
    return Path(os.environ.get("PARCEL_LEDGER", "/tmp/parcel-ledger"))


def effects(key: str) -> list[str]:
    """The deploys that acted under `key`, one line each."""
    path = _ledger() / key
    return path.read_text().splitlines() if path.exists() else []


def _step(name: str) -> Callable[[Any], dict[str, Any]]:
    def act(ctx: Any) -> dict[str, Any]:
        _ledger().mkdir(parents=True, exist_ok=True)
        with open(_ledger() / ctx.effect_key, "a") as ledger:
            ledger.write(f"{os.environ.get('PARCEL_DEPLOY', 'test')}\n")
        return {"step": name, "deploy": os.environ.get("PARCEL_DEPLOY", "test")}

    act.__name__ = name
    act.__doc__ = f"Check the ledger for the {name} effect by its key."
    return act


def _lookup(ctx: Any) -> dict[str, Any] | None:
    found = effects(ctx.effect_key)
    return {"step": ctx.step, "deploy": found[0], "found": True} if found else None


def declare(version: str) -> Workflow:
    """Declare `parcel` as deploy `version` has it."""
    workflow = Workflow("parcel", replace=True)
    for name, policy in VERSIONS[version]:
        resolvable = policy == "resolvable"
        workflow.step(policy=policy, lookup=_lookup if resolvable else None,
                      timeout=timedelta(seconds=0.2) if resolvable else None)(_step(name))
    return workflow


if os.environ.get("PARCEL_DEPLOY"):
    declare(os.environ["PARCEL_DEPLOY"])
