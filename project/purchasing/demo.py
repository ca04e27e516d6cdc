"""The purchase-order demo behind `manage.py demo`: workers killed mid-run, a resume, and the ledgers' counts.

Everything runs for real: the workers are `manage.py resume_runs` processes, each kill is a SIGKILL (sent by the
demo, or by the worker itself at a point armed with DURABLERUNS_CRASH_AT), and the far systems count what they
did in their own ledgers. The naive resume of the design source runs as separate processes too
(project/purchasing/naive.py), against a portal ledger of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from durableruns import services
from durableruns.holdings import lapse_phrase
from durableruns.models import Escalation, RunState, RunStatus, RunStep
from durableruns.registry import effect_key, get_workflow
from project.purchasing.demo_orders import OrdersAct
from project.purchasing.far import FarSystems, config_from_env, reset_all, systems

Say = Callable[[str], None]

LEASE = 2.0  # seconds: a dead worker's runs are free again this long after its last renewal
LINES = 240
QUOTE_KILL_AT = 100  # the demo kills the pricing worker once its loop checkpoint reaches this line
CREDIT_LAG = 5  # the credit vendor's lookup lags this many seconds (a minute in the design source)
COMPARED = 3  # orders crashed right after the portal accepted them, resumed the naive way and ours
# What the demo's last act tells you to run to see the back office (tests/site/test_demo_site.py serves the admin's
# CSS with it): the demo site's DEBUG is off, and runserver serves static files then only with --insecure.
SERVE = ".venv/bin/python manage.py runserver --insecure"
FAR_ENV = {
    "FAR_CREDIT_LOOKUP_LAG": str(CREDIT_LAG),
    "FAR_PORTAL_SEARCH_LAG": "5",
    "PURCHASING_CALL_TIMEOUT": "1",
    "DURABLERUNS_RETRY_BACKOFF_SECONDS": "0.5",
    "DURABLERUNS_LOOKUP_RETRY_SECONDS": "1",
}
SYSTEM_NAMES = {
    "credit": "credit vendor",
    "payments": "payment provider",
    "portal": "supplier portal",
    "carrier": "carrier",
    "email": "email sender",
}


class DemoError(Exception):
    """Something the demo relies on did not happen; the message says what."""


@dataclass(frozen=True)
class Fate:
    """How the worker of one run dies: at an armed point of a step, or killed by the demo mid-quote."""

    crash_at: str | None
    story: str


FATES = (
    Fate(None, f"killed by the demo while pricing its {LINES} lines"),
    Fate("credit_check@after_effect", "died just after the credit vendor answered, before recording the answer"),
    Fate("place_order@after_effect", "died just after the supplier portal accepted the order, before recording it"),
    Fate("notify_buyer@after_intent", "died after recording it would email the buyer, before sending the email"),
)


def reference(n: int) -> str:
    return f"PO-2026-{n:04d}"


@dataclass
class Demo:
    """One showing of the demo; `play` prints as it goes and raises DemoError if an invariant does not hold."""

    runs: int
    seed: int
    say: Say
    root: Path = field(default_factory=lambda: Path(settings.BASE_DIR))
    far_dir: Path = field(default_factory=lambda: config_from_env().directory.resolve())

    def __post_init__(self) -> None:
        self.ids = [reference(41 + i) for i in range(self.runs)]
        self.compared = [reference(41 + self.runs + i) for i in range(COMPARED)]
        self.abandoned = reference(41 + self.runs + COMPARED)
        self.far: FarSystems = systems()
        self.naive_dir = self.far_dir / "naive"
        self.tz = timezone.get_current_timezone()
        self.in_doubt: dict[str, str] = {}  # run -> the step its killed worker left in doubt

    # -- the show --------------------------------------------------------------------------------------------

    def play(self) -> None:
        started = time.monotonic()
        self.say("durableruns demo: purchase orders whose workers are killed in the middle, then resumed.")
        self.say("")
        self.reset()
        self.crash()
        self.show_record()
        passes = self.resume(self.ids)
        self.show_settled(passes)
        self.abandon()
        self.show_ledgers()
        self.compare()
        OrdersAct(self).play(8)
        self.show_where_to_look()
        self.say("")
        self.say(f"Done in {time.monotonic() - started:.0f} s.")

    def reset(self) -> None:
        gone = RunState.objects.filter(workflow="purchase_order", run_id__startswith="PO-2026-").delete()[1]
        reset_all(directory=self.far_dir)
        reset_all(directory=self.naive_dir)
        self.say(
            f"Emptied the far systems' ledgers ({self.far_dir}) and removed "
            f"{gone.get('durableruns.RunState', 0)} run(s) of an earlier demo."
        )
        for run_id in self.ids:
            services.start_run(
                "purchase_order", {"reference": run_id, "buyer": "Harbour Foods", "line_count": LINES}, run_id=run_id
            )
        plan = get_workflow("purchase_order")
        self.say(f"Started {self.runs} purchase_order runs, {self.ids[0]} to {self.ids[-1]}, {LINES} lines each.")
        self.say(f"Each one: {' -> '.join(plan.plan)}.")
        self.say("")

    def crash(self) -> None:
        """Start one worker per fate, each on its own run, and see every one of them die."""
        fates = FATES[: self.runs]
        self.say(
            f"1. {len(fates)} worker process{'es' if len(fates) > 1 else ''} each take one order, and each dies "
            "mid-run (SIGKILL: no clean-up, no last words):"
        )
        workers = {}
        for i, fate in enumerate(fates):
            env = {"PURCHASING_QUOTE_ITEM_SECONDS": "0.015" if fate.crash_at is None else "0.002"}
            if fate.crash_at:
                env["DURABLERUNS_CRASH_AT"] = fate.crash_at
            workers[self.ids[i]] = (
                fate,
                self.worker("--run", self.ids[i], "--lease", str(LEASE), "--worker", f"worker-{i + 1}", **env),
            )
        for i, (run_id, (fate, proc)) in enumerate(workers.items()):
            story = fate.story
            if fate.crash_at is None:
                line = self.wait_for_checkpoint(run_id, proc)
                proc.send_signal(signal.SIGKILL)
                story = f"{story} (it was past line {line})"
            try:
                out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise DemoError(f"worker {i + 1} on {run_id} did not die within a minute") from None
            if proc.returncode != -signal.SIGKILL:
                raise DemoError(
                    f"worker {i + 1} on {run_id} was expected to die but exited {proc.returncode}:\n{out}{err}"
                )
            self.say(f"   worker {i + 1} (pid {proc.pid}) on {run_id}: {story}")
        for run_id in self.ids[len(fates) :]:
            self.say(f"   {run_id}: not started by anyone yet")
        self.say("")

    def show_record(self) -> None:
        self.say("2. What the record says now: each run's recovery boundary, computed from its own rows alone")
        self.say("   (durableruns.boundary(run_id); the same sentence is in the admin and in show_run):")
        for run_id in self.ids:
            b = services.run_boundary(run_id)
            if b.in_doubt:
                self.in_doubt[run_id] = b.in_doubt[0]
            line = f"   {run_id}  {b.sentence(self.tz)}"
            quote = RunStep.objects.filter(run_id=run_id, step="quote", status="started").first()
            if quote is not None and quote.loop_cursor:
                line += f"  (quote's last loop checkpoint: line {quote.loop_cursor} of {LINES})"
            self.say(line)
        self.say("   In doubt = the intent was recorded and the outcome was not: the far system may or may not have")
        self.say("   acted. A resume must not guess; each step's policy says how to find out.")
        self.say("")

    def resume(self, run_ids: list[str], *, quiet: bool = False) -> list[str]:
        """Run resume_runs passes (fresh processes, as cron does) until no run is due or waiting."""
        self.wait_for_leases(run_ids)
        if not quiet:
            self.say("3. Resume: manage.py resume_runs in a fresh process, as cron runs it, once the dead workers'")
            self.say(f"   {LEASE:.0f} s leases have run out (a live worker renews its lease; a dead one cannot):")
        outputs = []
        for n in range(1, 6):
            waiting = RunState.objects.filter(pk__in=run_ids, status=RunStatus.WAITING).order_by("wake_at").first()
            if n > 1:
                if waiting is None:
                    break
                pause = (waiting.wake_at - timezone.now()).total_seconds()
                if not quiet:
                    self.say(
                        f"   pass {n}, at {waiting.wake_at.astimezone(self.tz):%H:%M:%S}, when the waiting run is "
                        f"due again:"
                    )
                time.sleep(max(0.0, pause) + 0.05)
            elif not quiet:
                self.say("   pass 1:")
            out = self.resume_pass()
            outputs.append(out)
            if not quiet:
                for line in out.splitlines():
                    self.say(f"     {line}")
        left = RunState.objects.filter(pk__in=run_ids, status__in=("pending", "running", "waiting")).count()
        if left:
            raise DemoError(f"{left} run(s) still due after five passes")
        if not quiet:
            self.say("")
        return outputs

    def show_settled(self, passes: list[str]) -> None:
        self.say("4. How each step in doubt was settled, by the policy its plan declares:")
        workflow = get_workflow("purchase_order")
        for run_id, step in self.in_doubt.items():
            policy = workflow[step].policy.value
            self.say(f"   {run_id}  {step} ({policy}): {self.how_settled(run_id, step, passes)}")
        self.say("")
        self.say("   Where every run ended:")
        for run_id in self.ids:
            run = RunState.objects.get(pk=run_id)
            self.say(f"   {run_id}  {run.status:<15} {self.sentence(run_id)}")
        bad = RunState.objects.filter(pk__in=self.ids).exclude(
            status__in=(RunStatus.COMPLETED, RunStatus.NEEDS_DECISION)
        )
        if bad.exists():
            stuck = list(bad.values_list("pk", "status"))
            raise DemoError(f"runs neither completed nor waiting for a decision: {stuck}")
        queue = list(Escalation.objects.open().filter(run_id__in=self.ids))
        if queue:
            self.say("")
            self.say(f"   The escalation queue ({len(queue)} waiting for a person):")
            for escalation in queue:
                self.say(
                    f"   {escalation.run_id} {escalation.step}, in doubt since "
                    f"{escalation.in_doubt_since.astimezone(self.tz):%H:%M:%S}: the email sender keeps no key "
                    "and has no lookup."
                )
                self.say(f"     Meanwhile it holds: {self.holds(escalation.run_id)}")
                self.say(
                    f"     How to check (the step's docstring): look in the sender's outbox for a message whose "
                    f"subject names {escalation.run_id}."
                )
            first = queue[0].run_id
            self.say("     Decide it in the admin's queue, or here, then resume:")
            self.say(
                f"     .venv/bin/python manage.py shell -c \"import durableruns; durableruns.decide('{first}', "
                f"'notify_buyer', 'did_not_happen', by='you', note='not in the outbox')\""
            )
            self.say("     .venv/bin/python manage.py resume_runs")
        self.say("")

    def abandon(self) -> None:
        """One more order waits in the queue holding its stock; staff abandon it and a worker gives the stock back."""
        run_id = self.abandoned
        self.say("5. Ending unfinished: one more order dies just before emailing the buyer, so it waits in the queue")
        self.say("   holding its stock reservation (reserve_stock, an acquisition: declared with release=).")
        services.start_run(
            "purchase_order", {"reference": run_id, "buyer": "Harbour Foods", "line_count": 10}, run_id=run_id
        )
        doomed = self.worker(
            "--run",
            run_id,
            "--lease",
            str(LEASE),
            "--worker",
            f"doomed-{run_id}",
            DURABLERUNS_CRASH_AT="notify_buyer@after_intent",
        )
        doomed.communicate(timeout=60)
        if doomed.returncode != -signal.SIGKILL:
            raise DemoError(f"the worker on {run_id} was expected to die; it exited {doomed.returncode}")
        self.resume([run_id], quiet=True)
        escalation = Escalation.objects.open().filter(run_id=run_id).first()
        if escalation is None:
            raise DemoError(f"{run_id} was expected to wait in the escalation queue")
        self.say(f"   In the queue: {run_id} {escalation.step}; it holds {self.holds(run_id)}.")
        services.resolve_escalation(escalation.pk, "abandon", by="demo staff", note="the buyer withdrew the order")
        run = RunState.objects.get(pk=run_id)
        self.say(f"   Staff abandon it: the run is now {run.status}, ending as {run.ending}. The admin's decision only")
        self.say("   records the act; a worker gives the stock back (an effect, never run inside a web request):")
        for out in self.resume([run_id], quiet=True):
            for line in out.splitlines():
                if line.startswith("PO-"):
                    self.say(f"     {line}")
        run = RunState.objects.get(pk=run_id)
        release = RunStep.objects.filter(run_id=run_id, step="reserve_stock:release", status="completed").first()
        if run.status != RunStatus.CANCELLED or release is None:
            raise DemoError(f"{run_id} ended {run.status} without releasing its reservation")
        reserved = self.far.warehouse.find_reservation(effect_key(run_id, "reserve_stock"))
        given = self.far.warehouse.find_release(release.effect_key)
        if reserved is None or given is None:
            raise DemoError(f"the warehouse has no reservation or release for {run_id}")
        self.say(
            f"   The warehouse's ledger: reservation {reserved['reservation_id']} given back as {given['release_id']} "
            f"under the release's own key {release.effect_key}."
        )
        self.say("")

    def holds(self, run_id: str) -> str:
        held = services.run_holdings(run_id, held_only=True)
        if not held:
            return "nothing in another system"
        now = timezone.now()
        return "; ".join(
            f"{h.step} ({(h.result or {}).get('reservation_id', '')}) since {h.since.astimezone(self.tz):%H:%M:%S}"
            + (f", {lapse_phrase(h.expires_at - now)}" if h.expires_at else "")
            if h.since
            else h.step
            for h in held
        )

    def show_ledgers(self) -> None:
        self.say("6. The far systems' own ledgers (each counts what it actually did, in its own store):")
        self.say(f"   {'system':<18}{'effects':>8}{'keys':>6}{'duplicates':>12}")
        total_duplicates = 0
        for name in ("credit", "payments", "portal", "carrier"):
            system = getattr(self.far, name)
            keys = system.counts_by_key()
            duplicates = sum(n - 1 for n in keys.values())
            total_duplicates += duplicates
            self.say(f"   {SYSTEM_NAMES[name]:<18}{sum(keys.values()):>8}{len(keys):>6}{duplicates:>12}")
        subjects: dict[str, int] = {}
        for effect in self.far.email.effects():
            subjects[effect["payload"]["subject"]] = subjects.get(effect["payload"]["subject"], 0) + 1
        repeats = sum(n - 1 for n in subjects.values())
        total_duplicates += repeats
        self.say(
            f"   {SYSTEM_NAMES['email']:<18}{sum(subjects.values()):>8}{'-':>6}{repeats:>12}"
            "   (no key: counted by subject, one per order at most)"
        )
        warehouse = self.far.warehouse
        warehouse_duplicates = sum(warehouse.duplicates().values())
        total_duplicates += warehouse_duplicates
        reservations = warehouse.reservations()
        released = [r for r in reservations if r["released"]]
        self.say(
            f"   {'warehouse':<18}{len(warehouse.effects()):>8}{len(warehouse.counts_by_key()):>6}"
            f"{warehouse_duplicates:>12}   ({len(reservations)} reservations, {len(released)} released)"
        )
        self.say(f"   duplicates: {total_duplicates}")
        if total_duplicates:
            raise DemoError(f"{total_duplicates} duplicate effect(s) at the far systems")
        ended = RunState.objects.filter(status__in=(RunStatus.CANCELLED, RunStatus.FAILED)).values_list(
            "run_id", flat=True
        )
        unfinished = {effect_key(run_id, "reserve_stock") for run_id in ended}
        leaked = [r for r in warehouse.held() if r["key"] in unfinished]
        kept = [r for r in warehouse.held() if r["key"] not in unfinished]
        self.say(
            f"   reservations held: {len(kept)} (by orders that completed or still wait), released: {len(released)} "
            f"(by orders that ended unfinished), leaked: {len(leaked)}"
        )
        if leaked:
            raise DemoError(f"{len(leaked)} reservation(s) of runs that ended unfinished still held: {leaked}")
        self.say("")

    def compare(self) -> None:
        self.say("7. The mistake the design source starts from: a resume that asks the portal's search")
        self.say(f'   "does PO-... exist?" before submitting. {COMPARED} more orders; each worker dies just after the')
        self.say("   portal accepted the order, and a fresh process resumes it right away. The search is served by")
        self.say("   a replica that lags up to 5 s; durableruns asks for the order by its own key, which the portal")
        self.say("   answers from its primary, at once.")
        for run_id in self.compared:
            services.start_run(
                "purchase_order", {"reference": run_id, "buyer": "Harbour Foods", "line_count": 10}, run_id=run_id
            )
        doomed = [
            self.worker(
                "--run",
                run_id,
                "--lease",
                "1",
                "--worker",
                f"doomed-{run_id}",
                DURABLERUNS_CRASH_AT="place_order@after_effect",
            )
            for run_id in self.compared
        ]
        self.say("   The naive resume (project/purchasing/naive.py), each in a process of its own:")
        naive_env = dict(self.env(), FAR_DIR=str(self.naive_dir))
        naive_env.pop("DJANGO_SETTINGS_MODULE", None)
        for i, run_id in enumerate(self.compared):
            env = dict(naive_env, FAR_SEED=str(self.seed * 100 + i))
            self.python(["-m", "project.purchasing.naive", "place", run_id], env, expect=-signal.SIGKILL)
            out = self.python(["-m", "project.purchasing.naive", "resume", run_id], env, expect=0)
            self.say(f"     {out.strip()}")
        self.say(f"     ({self.replica_story()})")
        for proc in doomed:
            proc.communicate(timeout=60)
            if proc.returncode != -signal.SIGKILL:
                raise DemoError(
                    f"a worker placing one of {self.compared} was expected to die; it exited {proc.returncode}"
                )
        self.say("   durableruns' resume (manage.py resume_runs), after the same crash:")
        for out in self.resume(self.compared, quiet=True):
            for line in out.splitlines():
                if line.startswith("PO-"):
                    self.say(f"     {line}")
        naive_portal = systems(directory=self.naive_dir).portal
        naive_orders = naive_portal.count()
        naive_duplicates = sum(n - 1 for n in naive_portal.counts_by_key().values())
        ours = {key: n for key, n in self.far.portal.counts_by_key().items() if key.rsplit(":", 1)[0] in self.compared}
        our_duplicates = sum(n - 1 for n in ours.values())
        self.say("")
        self.say(
            f"   {'after the same crash, ' + str(COMPARED) + ' orders':<40}{'orders at the portal':>22}"
            f"{'duplicates':>12}"
        )
        self.say(f"   {'naive resume (search, then submit)':<40}{naive_orders:>22}{naive_duplicates:>12}")
        self.say(f"   {'durableruns (look up by our own key)':<40}{sum(ours.values()):>22}{our_duplicates:>12}")
        if our_duplicates or len(ours) != COMPARED:
            raise DemoError(f"durableruns' portal orders for {self.compared}: {ours}")
        self.say("")

    def show_where_to_look(self) -> None:
        self.say("9. Look around:")
        self.say(f"   .venv/bin/python manage.py show_run {self.ids[0]}      every attempt of one run")
        self.say("   .venv/bin/python manage.py createsuperuser            then:")
        self.say(f"   {SERVE}")
        self.say("   (--insecure: this site runs with DEBUG off, and runserver then serves the admin's CSS and scripts")
        self.say("   only when told to; in production a web server serves what collectstatic gathers)")
        self.say("   http://127.0.0.1:8000/admin/durableruns/runstate/      the runs, their boundary, every attempt")
        self.say("   http://127.0.0.1:8000/admin/durableruns/escalation/    the escalation and approval queue")
        self.say("   http://127.0.0.1:8000/admin/durableruns/schedulestate/ the schedules, their next and last slot")

    # -- helpers ---------------------------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLERUNS_CRASH_")}
        env.update(
            FAR_ENV,
            DJANGO_SETTINGS_MODULE="project.settings",
            PYTHONUNBUFFERED="1",
            FAR_DIR=str(self.far_dir),
            FAR_SEED=str(self.seed),
        )
        env.update(extra)
        return env

    def worker(self, *args: str, **extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "manage.py", "resume_runs", "--skip-checks", *args],
            cwd=self.root,
            env=self.env(**extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def python(self, args: list[str], env: dict[str, str], *, expect: int) -> str:
        done = subprocess.run(
            [sys.executable, *args], cwd=self.root, env=env, capture_output=True, text=True, timeout=60
        )
        if done.returncode != expect:
            raise DemoError(f"{' '.join(args)} exited {done.returncode}, not {expect}:\n{done.stdout}{done.stderr}")
        return done.stdout

    def resume_pass(self) -> str:
        proc = self.worker("--once", "--lease", str(LEASE), "--worker", "cron", PURCHASING_QUOTE_ITEM_SECONDS="0.002")
        out, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise DemoError(f"resume_runs exited {proc.returncode}:\n{out}{err}")
        return out

    def wait_for_checkpoint(self, run_id: str, proc: subprocess.Popen[str]) -> int:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            row = (
                RunStep.objects.filter(run_id=run_id, step="quote", status="started", loop_cursor__gte=QUOTE_KILL_AT)
                .values_list("loop_cursor", flat=True)
                .first()
            )
            if row:
                return row
            if proc.poll() is not None:
                raise DemoError(f"the worker on {run_id} exited ({proc.returncode}) before line {QUOTE_KILL_AT}")
            time.sleep(0.02)
        raise DemoError(f"the worker on {run_id} did not reach line {QUOTE_KILL_AT} within a minute")

    def wait_for_leases(self, run_ids: list[str]) -> None:
        leases = RunState.objects.filter(pk__in=run_ids, status=RunStatus.RUNNING).values_list(
            "lease_expires_at", flat=True
        )
        latest: datetime | None = max((lease for lease in leases if lease), default=None)
        if latest is not None:
            time.sleep(max(0.0, (latest - timezone.now()).total_seconds()) + 0.05)

    def replica_story(self) -> str:
        """Say how far behind the replica was and how soon after the crash each naive search came."""
        orders = systems(directory=self.naive_dir).portal.effects()
        first: dict[str, dict[str, float]] = {}
        after = []
        for order in orders:
            seen = first.setdefault(order["reference"], order)
            if seen is not order:
                after.append(order["created_at"] - seen["created_at"])
        lags = [o["lag"] for o in first.values()]
        story = f"the replica was {min(lags):.1f} to {max(lags):.1f} s behind"
        if after:
            story += f"; each order was placed again {min(after):.1f} to {max(after):.1f} s after the first"
        return story

    def sentence(self, run_id: str) -> str:
        return services.run_boundary(run_id).sentence(self.tz)

    def how_settled(self, run_id: str, step: str, passes: list[str]) -> str:
        rows = list(RunStep.objects.filter(run_id=run_id, step=step).order_by("attempt"))
        key = effect_key(run_id, step)
        if Escalation.objects.open().filter(run_id=run_id, step=step).exists():
            return "no key, no lookup: nobody can tell whether it acted, so the run waits for a person."
        if step == "quote":
            checkpoint = rows[0].loop_cursor
            return (
                f"run again from its last checkpoint (line {checkpoint}): {LINES - checkpoint} of {LINES} lines "
                "priced again."
            )
        first = rows[0]
        waited = (
            f"the vendor's lookup lags {CREDIT_LAG} s, so the run waited, then "
            if any(f"{run_id}: waiting" in out for out in passes)
            else ""
        )
        if first.status == "completed" and first.resolution == "lookup":
            found = next((str(v) for k, v in (first.result or {}).items() if k.endswith("_id")), "it")
            return f"looked up by our key {key}: {waited}found {found}. Recorded; not done again."
        return f"looked up by our key {key}: {waited}not there once the lag had passed, so run again under that key."
