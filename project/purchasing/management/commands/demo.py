"""Show durableruns to a newcomer: purchase orders whose workers are killed mid-run, then resumed. Thin edge."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from project.purchasing.demo import Demo, DemoError
from project.purchasing.demo_orders import ActError


def _run_count(text: str) -> int:
    value = int(text)
    if value < 1 or value > 50:
        raise ValueError(text)
    return value


_run_count.__name__ = "count (1 to 50)"


class Command(BaseCommand):
    help = (
        "Start purchase orders, kill their workers (SIGKILL) mid-run, show each run's boundary, resume them with "
        "resume_runs, and print the far systems' ledgers (no duplicates) next to a naive resume's duplicates. "
        "Resets the far ledgers and earlier demo runs first."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--runs", type=_run_count, default=5, help="Purchase orders to start (default 5).")
        parser.add_argument(
            "--seed",
            type=int,
            default=41,
            help="Seed of the far systems' randomness, e.g. the portal's replica lag (default 41).",
        )

    def handle(self, *args: Any, runs: int, seed: int, **options: Any) -> None:
        def say(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        try:
            Demo(runs=runs, seed=seed, say=say).play()
        except (DemoError, ActError) as exc:
            raise CommandError(f"the demo went wrong: {exc}") from exc
        except DatabaseError as exc:
            raise CommandError(
                f"database error: {exc}\nIs the database migrated? bin/demo runs `manage.py migrate` first."
            ) from exc
