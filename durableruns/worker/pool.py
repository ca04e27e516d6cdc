"""N threads in one process, each claiming and working runs exactly as separate worker processes do.

Each thread has its own database connection (Django's connections are per thread) and claims with SKIP LOCKED,
so two threads never hold one run, by the same fencing that keeps two hosts apart. The threads share one
heartbeat (one renewal statement per beat for every lease in hand), one budget (`--limit`), one deadline
(`--max-seconds`), and one stop flag: once it is set, no thread claims again, and each hands its run back after
the step in hand. Idle threads wait on the waker (a notification, a timer for the next wake time, or the poll
interval), so the process holds no connection busy while nothing is due. While notifications reach the process,
a thread that ends a run goes idle without a claim if the process knows nothing else is due (Waker.nothing_due).
A single pass claims several runs at once where it can (durableruns.worker.prefetch).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import DatabaseError, DataError, IntegrityError, InterfaceError, connections

from durableruns import conf, faults, store
from durableruns.clock import Clock, idle_poll_seconds
from durableruns.engine import Engine
from durableruns.errors import FencedOut
from durableruns.models import RunStatus
from durableruns.passes import RunOutcome
from durableruns.registry import first_steps, limits
from durableruns.store.base import Claimed
from durableruns.store.claims import more_due_after_last_claim
from durableruns.store.prefetch import prefetches
from durableruns.worker.heartbeat import Heartbeat
from durableruns.worker.prefetch import Ahead

log = logging.getLogger("durableruns")


class Stopping:
    """Set once, by a signal or a deadline: no new claim, hand back after the step in hand."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.since: float | None = None  # time.monotonic() of the request
        self._then: list[Callable[[], None]] = []

    def then(self, call: Callable[[], None]) -> None:
        """Call `call` when the stop is requested (an idle waker must notice at once)."""
        self._then.append(call)

    def set(self) -> None:
        if self.since is None:
            self.since = time.monotonic()
        self._event.set()
        for call in self._then:
            call()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None) -> bool:
        return self._event.wait(timeout)


class Waker:
    """Where idle threads wait for work: woken at once by `wake()` (a notification), else after `timeout`.

    A wake rouses one idle thread, not all of them: a notification says "something is due", not how much. The
    thread that claims a run then wakes the next (WorkerPool._work_due), so a burst of runs fans out over the
    idle threads one claim at a time, and a single new run costs one claim, not one per idle thread.

    A wake is a permit that one thread's next wait takes, whenever that wait begins: a wake that came while every
    thread was looking (a run started just after a claim found nothing) ends the next wait at once instead of
    being lost, and it sends one thread to look again, not every thread that was looking meanwhile. Permits are
    kept up to the number of threads waiting (at least one): one permit not yet taken already promises a claim
    that begins after every wake before it, so more would only buy claims that find nothing.

    Between claims the process knows that nothing is due (`nothing_due`) while it hears every notification and a
    claim begun after the last wake either saw nothing else due or is still under way: the latter sees whatever
    that wake announced, and if more is due behind what it takes it wakes the next thread. So a thread that ends
    a run while another thread's claim answers the last wake goes idle instead of claiming beside it, one of the
    two finding nothing."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._permits = 0
        self._waiting = 0
        self._all = 0  # bumped by wake_all: every wait then ends
        # What the process knows of the record between claims (nothing_due): wakes so far, how many there were
        # when the latest claim that saw nothing (else) due began, and the latest reading of when the next run
        # comes due by itself (this process's monotonic clock when read, and the seconds it said then).
        self._wakes = 0
        self._quiet_at = -1
        self._looking: Counter[int] = Counter()  # claims under way, by the wakes there had been when each began
        self._next_due: tuple[float, float | None] | None = None
        self.hearing = False  # set by the listener while notifications reach this process

    def wake(self) -> None:
        """Rouse one idle thread, or, if none waits, end the next wait at once."""
        with self._condition:
            self._wakes += 1
            self._permits = min(self._permits + 1, max(1, self._waiting))
            self._condition.notify()

    @property
    def idle(self) -> int:
        """How many threads wait now."""
        with self._condition:
            return self._waiting

    def wakes(self) -> int:
        """How many wakes there have been: read before a claim, for saw_nothing_due after it."""
        with self._condition:
            return self._wakes

    def wake_unless_since(self, wakes: int) -> None:
        """Wake as `wake` does, unless there have been wakes since `wakes`: each of those already sends a thread
        to claim after it, which sees whatever a claim begun before it saw due."""
        with self._condition:
            if self._wakes != wakes:
                return
        self.wake()

    def claim_begins(self) -> int:
        """A claim begins: return the wakes so far (for saw_nothing_due), and count it under way until
        `claim_ended` is told that number, once what it saw is recorded."""
        with self._condition:
            self._looking[self._wakes] += 1
            return self._wakes

    def claim_ended(self, wakes: int) -> None:
        with self._condition:
            self._looking[wakes] -= 1
            if self._looking[wakes] <= 0:
                del self._looking[wakes]

    def saw_nothing_due(self, wakes: int, *, next_due: tuple[float, float | None] | None = None) -> None:
        """A claim begun after `wakes` wakes found nothing due but what it took; `next_due`, if it read it: when
        it read it (time.monotonic()) and the seconds until the next run comes due by itself (None: none will)."""
        with self._condition:
            self._quiet_at = max(self._quiet_at, wakes)
            if next_due is not None and (self._next_due is None or next_due[0] >= self._next_due[0]):
                self._next_due = next_due

    def nothing_due(self) -> tuple[bool, float | None]:
        """Whether the process knows that nothing is due now, and if so the seconds until the next run comes due
        by itself (None: none will). It knows while notifications reach it, a claim that saw nothing else due
        began after the last wake (or one begun after it is still under way), and the latest reading of the next
        wake time has not come yet: whatever made a run due since would have notified, and the thread that
        notification woke claims it."""
        with self._condition:
            answered = self._quiet_at == self._wakes or self._wakes in self._looking
            if not self.hearing or not answered or self._next_due is None:
                return False, None
            read_at, seconds = self._next_due
        if seconds is None:
            return True, None
        left = seconds - (time.monotonic() - read_at)
        return (True, left) if left > 0 else (False, None)

    def wake_all(self) -> None:
        """Rouse every idle thread: the pool is stopping."""
        with self._condition:
            self._all += 1
            self._condition.notify_all()

    def wait(self, timeout: float, *, unless: Callable[[], bool] = lambda: False) -> bool:
        """Wait until a permit is there to take (taking it), or `unless()` holds, or `timeout` seconds pass;
        return whether a permit was taken."""
        with self._condition:
            everyone = self._all
            self._waiting += 1
            try:
                self._condition.wait_for(
                    lambda: self._permits > 0 or self._all != everyone or unless(), timeout=timeout
                )
            finally:
                self._waiting -= 1
            if self._permits > 0:
                self._permits -= 1
                return True
            return False


@dataclass
class Budget:
    """How many runs the pool may still take (None: as many as are due)."""

    left: int | None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> bool:
        with self._lock:
            if self.left is None:
                return True
            if self.left <= 0:
                return False
            self.left -= 1
            return True

    def take_up_to(self, wanted: int) -> int:
        """Take as many as `wanted` at most, as many as are left; return how many were taken."""
        with self._lock:
            if self.left is None:
                return wanted
            taken = max(0, min(wanted, self.left))
            self.left -= taken
            return taken

    def give_back(self, runs: int = 1) -> None:
        with self._lock:
            if self.left is not None:
                self.left += runs


@dataclass(kw_only=True)
class PassReport:
    """What a pool did: an outcome per run handled, what crashed, and which thread holds what."""

    outcomes: list[RunOutcome] = field(default_factory=list)
    crashed: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    pickup: str = ""  # how idle threads were woken at the end: the listener's state, or polling
    outlived: list[str] = field(default_factory=list)  # steps in hand that outlived their timeout (watchdog)
    claims: int = 0  # claims made, and how many of them found nothing due
    found_nothing: int = 0
    timetable_restarts: int = 0  # a --loop worker's timetable, started again after a look raised (logged)
    leased: str = ""  # with nothing due, what holds the rest, e.g. "1 run leased until 14:07:12" (resume_runs)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count_claim(self, *, found: bool) -> None:
        with self._lock:
            self.claims += 1
            self.found_nothing += not found

    @property
    def steps_run(self) -> int:
        return sum(o.steps_run for o in self.outcomes)

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for o in self.outcomes:
            counts[o.status] = counts.get(o.status, 0) + 1
        return counts

    def summary(self) -> str:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(self.counts().items())) or (
            f"nothing due: {self.leased}" if self.leased else "nothing due"
        )
        crashed = f", {len(self.crashed)} raised" if self.crashed else ""
        pickup = f"; {self.pickup}" if self.pickup else ""
        outlived = "".join(f"\n  outlived its timeout: {step}" for step in self.outlived)
        restarts = (
            f"; the timetable raised and was started again {self.timetable_restarts} time(s)"
            if self.timetable_restarts
            else ""
        )
        return (
            f"{len(self.outcomes)} run(s) handled in {self.seconds:.2f}s: {counts}{crashed}; "
            f"{self.steps_run} step(s) run; {self.claims} claim(s), {self.found_nothing} found nothing"
            f"{pickup}{restarts}{outlived}"
        )


@dataclass(frozen=True, kw_only=True)
class InHand:
    """A run a thread is working now, for the operator: which thread, since when (this process's clock)."""

    run_id: str
    thread: str
    since: float


class WorkerPool:
    """Work due runs with `concurrency` threads until nothing is due (or, with `waker`, until stopped)."""

    def __init__(
        self,
        *,
        concurrency: int,
        owner: str,
        lease_seconds: float,
        clock: Clock,
        heartbeat: Heartbeat,
        report: PassReport,
        budget: Budget,
        run_id: str | None = None,
        deadline: float | None = None,
        stopping: Stopping | None = None,
        waker: Waker | None = None,
        idle_seconds: float = 5.0,
        timer: Callable[[], float | None] | None = None,
        on_claim: Callable[[float], None] | None = None,
        on_outcome: Callable[[RunOutcome], None] | None = None,
        queues: tuple[str, ...] = (),
    ) -> None:
        self.concurrency = concurrency
        self.queues = queues  # only runs on these queues (empty: every queue)
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.heartbeat = heartbeat
        self.report = report
        self.budget = budget
        self.run_id = run_id
        self.deadline = deadline
        self.stopping = stopping or Stopping()
        self.waker = waker
        self.idle_seconds = idle_seconds
        self.timer = timer  # seconds until the next run comes due by itself (a wake time, a lease running out)
        self.on_claim = on_claim  # hears how long each claim took (a worker's metrics)
        self.on_outcome = on_outcome
        self.error: DatabaseError | InterfaceError | None = None
        self._raised: BaseException | None = None
        if waker is not None:
            self.stopping.then(waker.wake_all)
        self._in_hand: dict[str, InHand] = {}
        self._lock = threading.Lock()
        # A single pass (no waker: --once, or resume_due called in-process) drains what is due and ends. A run it
        # left due again at once (a wait already over: DURABLERUNS_LOOKUP_RETRY_SECONDS=0), or whose pass raised,
        # would be claimed again and again, oldest first, and the pass never end: it leaves those to the next.
        self._left: set[str] = set()
        # A single pass may claim several runs at once (store.prefetch): those it does not begin at once wait here.
        self._ahead = Ahead(heartbeat, lease_seconds, clock) if self._single_pass else None

    def in_hand(self) -> list[InHand]:
        with self._lock:
            return list(self._in_hand.values())

    # -- running ---------------------------------------------------------------------------------------------

    def run(self, *, grace: float | None = None) -> None:
        """Work until done, then wait for the threads: at most `grace` seconds once stopping.

        With a grace (a worker process), every thread works off the main thread, the only one at any
        concurrency, so the main thread stays free for signals and gives up on a step that outlives the grace
        whatever the concurrency. Without one, a single thread works on the caller's thread and connection.

        A database that cannot be reached, met by any thread, stops every thread and is raised here; so is
        anything else a thread raised outside a run's turn (a bug), as it would be on the caller's thread."""
        if self.concurrency == 1 and grace is None:
            self._thread_main(self.owner, own_connection=False)
        else:
            names = (
                [self.owner] if self.concurrency == 1 else [f"{self.owner}#{n}" for n in range(1, self.concurrency + 1)]
            )
            threads = [
                threading.Thread(target=self._thread_guarded, args=(name,), daemon=True, name=f"durableruns-worker-{n}")
                for n, name in enumerate(names, start=1)
            ]
            for thread in threads:
                thread.start()
            # Joined in slices: the main thread stays free for signals, and gives up on threads whose step
            # outlives the grace period. The step in hand is left as it stands, its intent committed and its
            # result not: in doubt, settled by its policy once its lease runs out (the heartbeat stops with the
            # pass), exactly as after a crash; nothing is marked failed.
            while any(thread.is_alive() for thread in threads):
                for thread in threads:
                    thread.join(0.05)
                since = self.stopping.since
                if grace is not None and since is not None and time.monotonic() - since >= grace:
                    log.warning(
                        "stopping: %d thread(s) still in a step after the %gs grace period; leaving them",
                        sum(t.is_alive() for t in threads),
                        grace,
                    )
                    break
        if self._ahead is not None:
            self._ahead.hand_back()
        if self.error is not None:
            raise self.error
        if self._raised is not None:
            raise self._raised

    def _thread_guarded(self, owner: str) -> None:
        """A worker thread's life: what it raises past its runs' turns stops the pool and is raised by run()."""
        try:
            self._thread_main(owner)
        except BaseException as exc:  # a bug outside any run's turn; the caller's thread raises it
            if self._raised is None:
                self._raised = exc
            self.stopping.set()

    def _thread_main(self, owner: str, *, own_connection: bool = True) -> None:
        engine = Engine(self.clock, heartbeat=self.heartbeat, stopping=self.stopping.is_set)
        try:
            while not self.stopping.is_set() and self.error is None:
                exhausted, due_in = self._work_due(engine, owner)
                if exhausted or self.waker is None or self.run_id is not None or self._past_deadline():
                    break
                # Nothing is due (the last claim found nothing, or the process knows); a wake since left a
                # permit, which ends the wait at once.
                self.waker.wait(self._idle_timeout(due_in), unless=self.stopping.is_set)
        except (DatabaseError, InterfaceError) as exc:
            self.error = exc
            self.stopping.set()
        finally:
            if own_connection:
                connections.close_all()  # this thread's own

    @property
    def _single_pass(self) -> bool:
        return self.waker is None and self.run_id is None

    def _leave(self, run_id: str) -> None:
        """Leave `run_id` to the next pass, if this is a single pass."""
        if self._single_pass:
            with self._lock:
                self._left.add(run_id)

    def _leaving(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._left)

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _idle_timeout(self, due_in: float | None) -> float:
        left = None if self.deadline is None else self.deadline - time.monotonic()
        return idle_timeout(due_in, poll=min(self.idle_seconds, idle_poll_seconds()), deadline_in=left)

    def _claim(self, owner: str, waker: Waker | None) -> tuple[Claimed | None, float | None]:
        """Claim the next due run, and tell `waker` what the claim saw; return the run taken, if any, else the
        seconds until the next run comes due by itself, if the claim read them."""
        wakes = waker.claim_begins() if waker is not None else 0
        try:
            asked = time.monotonic() if self.on_claim is not None else 0.0
            claimed = store.claim(
                owner=owner,
                lease_seconds=self.lease_seconds,
                clock=self.clock,
                run_id=self.run_id,
                first_steps=first_steps(),
                before_first_intent=_before_first_intent(),
                hints=self.waker is not None,  # idle threads that wait need when to wake, and whom
                skip=self._leaving(),
                queues=self.queues,
            )
            if self.on_claim is not None:
                self.on_claim(time.monotonic() - asked)
            self.report.count_claim(found=claimed is not None)
            if claimed is None:
                self.budget.give_back()
                if waker is None or self.timer is None:  # the thread stops here, or polls: no timer to set
                    return None, None
                due_in = self.timer()  # read by the claim itself: no statement of its own
                waker.saw_nothing_due(wakes, next_due=(time.monotonic(), due_in))
                return None, due_in
            if waker is not None:
                if more_due_after_last_claim():
                    # Another run was due behind this one: the next idle thread looks while this one works.
                    waker.wake_unless_since(wakes)
                else:
                    waker.saw_nothing_due(wakes)
            return claimed, None
        finally:
            if waker is not None:
                waker.claim_ended(wakes)  # after what it saw is told: a thread that ends a run meanwhile relies on it

    def _prefetching(self) -> bool:
        """Whether this thread's next claim may take several runs (store.prefetch): a single pass, with no fault
        armed at the first intent (the crash matrix's points stay one run a claim)."""
        return self._ahead is not None and _before_first_intent() is None and prefetches()

    def _claim_ahead(self, owner: str) -> tuple[Claimed | None, float | None]:
        """Claim as many runs as DURABLERUNS_PREFETCH (and the budget) allow in one statement; begin the first, and
        keep the others for the next free threads. Nothing due, or the database refused a first intent riding on
        it: the one-run claim, which looks for runs to reopen when nothing is due, and records such an intent on
        its own."""
        assert self._ahead is not None
        more = self.budget.take_up_to(conf.prefetch() - 1)
        taken = self._ahead.claim(owner, most=1 + more, queues=self.queues, skip=self._leaving())
        self.budget.give_back(more + 1 - max(1, len(taken)))
        if not taken:
            return self._claim(owner, None)  # the budget it took for one run is still taken
        self.report.count_claim(found=True)
        return taken[0], None

    def _work_due(self, engine: Engine, owner: str) -> tuple[bool, float | None]:
        """Claim and work runs until none is due; return whether the budget ran out, and the seconds until the
        next run comes due by itself (None: none will, or not known)."""
        waker = self.waker if self.run_id is None else None
        one_at_a_time = False
        while not self.stopping.is_set() and not self._past_deadline():
            claimed = self._ahead.take() if self._ahead is not None else None  # its budget taken by its claim
            if claimed is None:
                if not self.budget.take():
                    return True, None
                ahead = self._prefetching() and not one_at_a_time
                claimed, due_in = self._claim_ahead(owner) if ahead else self._claim(owner, waker)
                if claimed is None and self._ahead is not None:
                    claimed = self._ahead.after_claims(stopping=self.stopping.is_set)
                if claimed is None:
                    return False, due_in
            # A run its concurrency limit admitted is claimed one at a time (store.prefetch): so is the next.
            one_at_a_time = claimed.workflow in limits()
            run_id = claimed.lease.run_id
            with self._lock:
                self._in_hand[threading.current_thread().name] = InHand(
                    run_id=run_id, thread=owner, since=time.monotonic()
                )
            try:
                outcome = engine.work(claimed)
            except (DataError, IntegrityError) as exc:  # this run's data, not the database's health
                self.report.crashed.append((run_id, set_aside(claimed.lease, exc, self.clock, refused=True)))
                self._leave(run_id)
                continue
            except (DatabaseError, InterfaceError):  # the database's health (InterfaceError: a closed connection)
                raise
            except Exception as exc:  # a bug, not a step's failure: record it, keep the others going
                self.report.crashed.append((run_id, set_aside(claimed.lease, exc, self.clock)))
                self._leave(run_id)
                continue
            finally:
                with self._lock:
                    self._in_hand.pop(threading.current_thread().name, None)
            self.report.outcomes.append(outcome)
            if outcome.status == RunStatus.WAITING and outcome.wake_at is not None and self._single_pass:
                if outcome.wake_at <= self.clock.now():  # due again already
                    self._leave(run_id)
            if self.on_outcome is not None:
                self.on_outcome(outcome)
            if self.run_id is not None:
                break
            if waker is not None and outcome.status in _ENDED:
                # A run that ended makes nothing due (one set to wait or handed back notifies, and is claimed
                # again): if the process knows nothing else is, idle at once instead of a claim that finds nothing.
                known, due_in = waker.nothing_due()
                if known:
                    return False, due_in
        return False, None


# How long an idle thread waits when the run due next by itself is due already: held elsewhere (the claim skipped
# it, locked), so it is looked at again after this, not spun on.
HELD_RECHECK_SECONDS = 0.05
# How far past a wake time an idle thread wakes, so that its claim, on the database's clock, finds it due.
PAST_DUE_SECONDS = 0.002


def idle_timeout(due_in: float | None, *, poll: float, deadline_in: float | None = None) -> float:
    """How long an idle thread waits at most: the poll interval `poll`, or until just after `due_in` seconds, when
    the next run comes due by itself (None: none will), however soon that is; never past a deadline `deadline_in`
    seconds away."""
    timeout = poll
    if due_in is not None:
        timeout = min(timeout, (due_in if due_in > 0 else HELD_RECHECK_SECONDS) + PAST_DUE_SECONDS)
    if deadline_in is not None:
        timeout = max(0.0, min(timeout, deadline_in))
    return timeout


_ENDED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


def _before_first_intent() -> Callable[[str], None] | None:
    """The fault-injection point before a first intent that rides on the claim; None (no hook) unless armed."""
    if not faults.armed():
        return None
    return lambda step: faults.reached("before_intent", step)


def set_aside(lease: store.Lease, exc: Exception, clock: Clock, *, refused: bool = False) -> str:
    """Record why a run's pass raised and release it, fenced on its epoch (a run another worker took meanwhile is
    left to it); return the error as the operator sees it. A bug waits out a backoff and is tried again; data the
    database `refused` (an over-long step name) would be refused again at every try, each time first in the
    pass: that run is stopped for staff, the error its reason, where runs_health and the alerts report it."""
    error = f"{type(exc).__name__}: {exc}".strip()
    log.error("run %s: durableruns raised while working it: %s", lease.run_id, error, exc_info=exc)
    if refused:
        status, wake_at = RunStatus.NEEDS_DECISION, None
        reason = (
            f"{REFUSED_MARK}{error}). Trying again would be refused the same way: staff decide (fix the "
            f"declaration and retry the run, or cancel it)"
        )
    else:
        status, wake_at = RunStatus.WAITING, clock.now() + conf.internal_error_backoff()
        reason = f"durableruns raised while working this run ({error}); trying again after a backoff"
    try:
        store.release(lease, status=status, clock=clock, wake_at=wake_at, reason=reason)
    except FencedOut:
        pass
    except (DatabaseError, InterfaceError) as again:  # the lease runs out on its own and the run is taken again then
        log.error("run %s: could not record the error: %s", lease.run_id, again)
    return error


# How the reason of a run stopped because the database refused its data begins (ops.health sorts reasons by it).
REFUSED_MARK = "stopped for staff: the database refused this run's data ("
