"""Run attributes (durableruns.attributes): written inside the commit that creates the run or records a step's
result, never in one of their own, so a run has its attributes exactly when that commit happened."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from durableruns.attributes import as_record
from durableruns.models import RunAttribute


def write_attributes(run_id: str, values: Mapping[str, Any]) -> None:
    """Add or replace the attributes `values` (checked already) of run `run_id`, inside the caller's transaction
    (which fenced the run first, or created it)."""
    if not values:
        return
    RunAttribute.objects.filter(run_id=run_id, name__in=list(values)).delete()
    RunAttribute.objects.bulk_create(
        [
            RunAttribute(run_id=run_id, name=name, value_text=text, kind=kind)
            for name, (text, kind) in ((name, as_record(value)) for name, value in values.items())
        ]
    )


def write_many(rows: Mapping[str, Mapping[str, Any]]) -> None:
    """The attributes of runs just created in the caller's transaction (child runs): {run_id: values}."""
    RunAttribute.objects.bulk_create(
        [
            RunAttribute(run_id=run_id, name=name, value_text=as_record(value)[0], kind=as_record(value)[1])
            for run_id, values in rows.items()
            for name, value in values.items()
        ],
        ignore_conflicts=True,
    )  # a child recorded already kept the attributes of its first commit
