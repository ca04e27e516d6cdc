"""Measure a step's checkpointed loop and print the checkpoint trade-off for it.

    python manage.py measure_loop WORKFLOW STEP [--input JSON] [--results JSON] [--every 1,5,10,25,50,100]

The measuring itself is durableruns.measuring; this command parses, calls it once, and prints the table.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from durableruns.errors import NotMeasurable
from durableruns.measuring import measurable_step, measure
from durableruns.tradeoff import DEFAULT_BATCH_SIZES, balance_point, render, tradeoff


def _json_object(option: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(f"{option} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CommandError(f"{option} must be a JSON object, not {type(value).__name__}")
    return value


def _batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--every takes whole numbers separated by commas, not {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("--every takes batch sizes of at least 1")
    return sizes


class Command(BaseCommand):
    help = ("Run a re_executable step once, time each item of its ctx.loop and real checkpoint commits (on a "
            "scratch run, deleted afterwards), and print commit overhead against worst-case rework per batch size.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("workflow")
        parser.add_argument("step")
        parser.add_argument("--input", default="{}", help="The run's input, a JSON object (default {}).")
        parser.add_argument("--results", default="{}",
                            help="Earlier steps' results the step reads, a JSON object by step name (default {}).")
        parser.add_argument("--every", type=_batch_sizes, default=DEFAULT_BATCH_SIZES,
                            help="Batch sizes to compare, comma-separated (default 1,5,10,25,50,100).")

    def handle(self, *args: Any, workflow: str, step: str, input: str, results: str, every: tuple[int, ...],
               **options: Any) -> None:
        try:
            measured = measure(measurable_step(workflow, step), input=_json_object("--input", input),
                               results=_json_object("--results", results))
        except NotMeasurable as exc:
            raise CommandError(str(exc)) from None
        t = measured.timing
        sizes = sorted({*every, measured.every})
        self.stdout.write(f"{workflow}.{step}: {t.items} items in {measured.step_seconds:.3f} s; the step "
                          f"checkpoints every {measured.every}")
        self.stdout.write(f"per item t = {t.item_seconds * 1000:.3f} ms (mean of {t.items}); checkpoint commit "
                          f"c = {t.commit_seconds * 1000:.3f} ms (mean of {t.commits} real commits on a scratch run)")
        self.stdout.write("")
        for line in render(tradeoff(t.items, t.item_seconds, t.commit_seconds, sizes), marked=measured.every):
            self.stdout.write(line)
        b = balance_point(t.items, t.item_seconds, t.commit_seconds)
        self.stdout.write("")
        self.stdout.write(f"balance point b* = sqrt(n * c / t) = {b:.1f} items: checkpointing more often costs "
                          "more commit time than the rework it saves, less often risks more rework than it saves.")
