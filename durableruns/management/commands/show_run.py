"""Print one run: the operator sentence, the boundary step by step, and every attempt."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from durableruns import services, timeline
from durableruns.errors import RunNotFound
from durableruns.holdings import lapse_phrase
from durableruns.models import RunEvent, RunState, RunStep


class Command(BaseCommand):
    help = "Show a run's recovery boundary and every attempt of every step."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run_id")

    def handle(self, *args: Any, run_id: str, **options: Any) -> None:
        try:
            run = services.get_run(run_id)
        except RunNotFound as exc:
            raise CommandError(str(exc)) from exc
        tz = timezone.get_current_timezone()
        b = services.boundary_of(run)
        self.stdout.write(f"{run.run_id} ({run.workflow}): {run.status}")
        self.stdout.write(f"  {b.sentence(tz)}")
        plan = services.run_plan(run)  # the plan the run started under, whatever this deploy has
        described = plan.describe() if plan else "not recorded"
        self.stdout.write(f"  plan {run.plan_fingerprint}: {described}")
        if run.parent_id:
            parent = RunState.objects.filter(pk=run.parent_id).values_list("workflow", "status").first()
            self.stdout.write(f"  child of {run.parent_id} ({': '.join(parent) if parent else 'deleted'})")
        if run.reason:
            self.stdout.write(f"  reason: {run.reason}")
        if run.wake_at:
            self.stdout.write(f"  wakes at {run.wake_at.astimezone(tz):%Y-%m-%d %H:%M:%S}")
        if run.ending:
            self.stdout.write(f"  ending unfinished: gives back what it holds, then it is {run.ending}")
        progress = timeline.latest_progress(run.run_id)
        if progress is not None:
            counted = f" ({progress['done']}/{progress['total'] if progress['total'] is not None else '?'})" if (
                progress["done"] is not None) else ""
            self.stdout.write(f"  progress of {progress['step']}: {progress['message']}{counted} "
                              f"at {_clock(progress['at'], tz)}")
        held = services.holdings_of(run, held_only=True)
        self.stdout.write("holds:" if held else "holds: nothing in another system")
        now = timezone.now()
        for h in held:
            line = f"  {h.step:<20} {h.state.value:<13} since={_clock(h.since, tz)}"
            if h.expires_at:
                line += f" expires={h.expires_at.astimezone(tz):%Y-%m-%d %H:%M:%S} ({lapse_phrase(h.expires_at - now)})"
            if h.release_status:
                line += f" release {h.release_status} ({h.release_attempts} attempt(s))"
            line += f"\n      result: {json.dumps(h.result, sort_keys=True)}"
            self.stdout.write(line)
        self.stdout.write("boundary:")
        for step in b.plan:
            self.stdout.write(f"  {step:<20} {b.zone(step).value}")
        self.stdout.write("attempts:")
        for a in RunStep.objects.of_run(run.run_id):
            line = (f"  {a.step:<20} #{a.attempt} {a.status:<9} key={a.effect_key} "
                    f"started={_clock(a.started_at, tz)} finished={_clock(a.finished_at, tz)} "
                    f"epoch={a.epoch} owner={a.owner}")
            if a.loop_cursor:
                line += f" loop={a.loop_cursor}"
            if a.resolution:
                line += f" ({a.get_resolution_display()})"
            if a.error:
                line += f"\n      error: {a.error.splitlines()[-1]}"
            self.stdout.write(line)
        events = list(RunEvent.objects.filter(run_id=run.run_id).order_by("sent_at", "id"))
        self.stdout.write("events:" if events else "events: none sent")
        for e in events:
            consumed = (f"consumed by {e.consumed_step} #{e.consumed_attempt} at {_clock(e.consumed_at, tz)}"
                        if e.consumed_at else "kept: no wait has consumed it")
            self.stdout.write(f"  {e.event:<20} sent={_clock(e.sent_at, tz)} key={e.key or '-'} {consumed}"
                              f"\n      payload: {json.dumps(e.payload, sort_keys=True)}")
        children = list(RunState.objects.children_of(run.run_id).values_list("run_id", "workflow", "status"))
        if children:
            self.stdout.write(f"children ({len(children)}):")
        for child, workflow, status in children:
            self.stdout.write(f"  {child} ({workflow}): {status}")


def _clock(when: Any, tz: Any) -> str:
    return f"{when.astimezone(tz):%H:%M:%S.%f}"[:-3] if when else "-"
