"""The pure arithmetic of step rate limits (durableruns.rates): parsing, and whose turn it is, checked against
simulated fleets of runs arriving and being picked up late at random."""

from __future__ import annotations

import heapq
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durableruns.errors import DeclarationError
from durableruns.rates import Rate, free_at, parse_rate, turn, waiting_reason

T0 = datetime(2026, 12, 4, 14, 7, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)


@pytest.mark.parametrize(
    ("text", "limit", "window"),
    [("5/s", 5, SECOND), ("100/m", 100, timedelta(minutes=1)), ("1/h", 1, timedelta(hours=1)), ("20/s", 20, SECOND)],
)
def test_a_rate_is_n_per_second_minute_or_hour(text, limit, window):
    rate = parse_rate(text)
    assert (rate.limit, rate.window) == (limit, window) and str(rate) == text


@pytest.mark.parametrize(
    "text", ["0/s", "-1/s", "5/d", "5 / s", "5/sec", "5", "/s", "1.5/s", "05/s", "", None, 5, "5/S", " 5/s"]
)
def test_a_malformed_rate_is_a_declaration_error_naming_it(text):
    with pytest.raises(DeclarationError, match="rate must be"):
        parse_rate(text, where="carrier")


def test_the_window_is_sliding_not_a_bucket_refilled():
    """After a quiet spell a token bucket of 5 refilled 5 a second lets 9 start within one second (5 at its end,
    4 more once it refills); here the sixth waits until the first start leaves the window."""
    rate = parse_rate("5/s")
    starts = [T0 + timedelta(milliseconds=900 + i) for i in range(5)]  # a burst at the end of a quiet second
    later = T0 + timedelta(milliseconds=1100)  # a bucket refilled at T0 + 1 s would let this one go
    assert free_at(rate, now=later, starts=starts) == starts[0] + SECOND
    decided = turn(rate, now=later, starts=starts)
    assert not decided.go and decided.at == starts[0] + SECOND


def test_a_start_counts_in_the_half_open_window_ending_now():
    rate = parse_rate("1/s")
    assert not turn(rate, now=T0 + SECOND - timedelta(microseconds=1), starts=[T0]).go
    assert turn(rate, now=T0 + SECOND, starts=[T0]).go


def test_the_margin_lengthens_the_window():
    rate = parse_rate("1/s")
    margin = timedelta(milliseconds=100)
    decided = turn(rate, now=T0 + SECOND, starts=[T0], margin=margin)
    assert not decided.go and decided.at == T0 + SECOND + margin


def test_a_newcomer_queues_behind_the_turns_given_and_a_turn_holder_waits_for_its_time():
    rate = parse_rate("2/s")
    starts = [T0, T0]
    given = [T0 + SECOND, T0 + SECOND]  # two runs wait for the next second already
    newcomer = turn(rate, now=T0 + timedelta(milliseconds=10), starts=starts, reserved=given)
    assert not newcomer.go and newcomer.at == T0 + 2 * SECOND
    early = turn(rate, now=T0 + timedelta(milliseconds=10), starts=starts, mine=given[0])
    assert not early.go and early.at == given[0]
    due = turn(rate, now=T0 + SECOND, starts=starts, mine=given[0])
    assert due.go


def test_a_turn_holder_late_behind_a_later_start_waits_for_the_moment_the_window_has_room():
    rate = parse_rate("1/s")
    start = T0 + timedelta(milliseconds=300)  # another run started late, after this one's turn had come
    decided = turn(rate, now=T0 + timedelta(milliseconds=400), starts=[start], mine=T0)
    assert not decided.go and decided.at == start + SECOND


def test_the_reason_names_the_step_the_key_and_the_time():
    at = datetime(2026, 12, 4, 14, 7, 12, tzinfo=UTC)
    assert waiting_reason("book_shipment", "dhl", at) == (
        "waiting for the rate limit of book_shipment (key dhl) until 14:07:12"
    )
    assert waiting_reason("book_shipment", "", at) == "waiting for the rate limit of book_shipment until 14:07:12"


def _simulate(
    rate: Rate, arrivals: list[float], delays: list[float], margin: float = 0.0
) -> tuple[list[datetime], int]:
    """Runs arriving at `arrivals` (seconds from T0) take their turns as durableruns.store.rates does, one at a
    time under the bucket's lock; a run told to wait is picked up `delays[i % len]` seconds after its turn's time
    (a worker's timer, a claim). Entries older than the window are deleted as the store deletes them. Returns the
    starts in order and how many times a run was handed back."""
    span = rate.window + timedelta(seconds=margin)
    log: dict[int, tuple[datetime, bool]] = {}  # run -> (time, started)
    events = [(T0 + timedelta(seconds=a), i) for i, a in enumerate(arrivals)]
    heapq.heapify(events)
    starts: list[datetime] = []
    waits = 0
    while events:
        now, run = heapq.heappop(events)
        log = {r: e for r, e in log.items() if e[0] > now - span}
        mine = log[run][0] if run in log and not log[run][1] else None
        decided = turn(
            rate,
            now=now,
            starts=[t for t, s in log.values() if s],
            reserved=[t for r, (t, s) in log.items() if not s and r != run],
            mine=mine,
            margin=timedelta(seconds=margin),
        )
        if decided.go:
            log[run] = (now, True)
            starts.append(now)
            continue
        assert decided.at > now
        log[run] = (decided.at, False)
        waits += 1
        heapq.heappush(events, (decided.at + timedelta(seconds=delays[waits % len(delays)]), run))
    return starts, waits


def _most_in_a_window(starts: list[datetime], window: timedelta) -> int:
    return max(sum(1 for u in starts if t <= u < t + window) for t in starts)


@given(
    limit=st.integers(1, 6),
    unit=st.sampled_from(["s", "m"]),
    arrivals=st.lists(st.floats(0, 5, allow_nan=False), min_size=1, max_size=40),
    delays=st.lists(st.floats(0, 0.5, allow_nan=False), min_size=1, max_size=10),
    margin=st.sampled_from([0.0, 0.1]),
)
def test_no_window_ever_holds_more_than_n_starts_and_every_run_starts(limit, unit, arrivals, delays, margin):
    rate = parse_rate(f"{limit}/{unit}")
    starts, _ = _simulate(rate, arrivals, delays, margin)
    assert len(starts) == len(arrivals)  # every run starts
    assert _most_in_a_window(starts, rate.window) <= limit
    ordered = sorted(starts)  # the same, said of the log: any N + 1 starts span more than the window
    assert all(b - a >= rate.window + timedelta(seconds=margin) for a, b in zip(ordered, ordered[limit:], strict=False))


@given(limit=st.integers(1, 6), runs=st.integers(1, 60))
def test_runs_picked_up_on_time_follow_the_ideal_schedule_waiting_once_each(limit, runs):
    """All arriving at once and picked up the moment their turn comes: the k-th starts at (k // N) windows, and
    each run is handed back at most once (computed, not polled)."""
    rate = parse_rate(f"{limit}/s")
    starts, waits = _simulate(rate, [0.0] * runs, [0.0])
    assert starts == [T0 + (k // limit) * SECOND for k in range(runs)]
    assert waits == max(0, runs - limit)


# -- the declaration ---------------------------------------------------------------------------------------------


def test_a_malformed_rate_is_refused_when_the_step_is_declared():
    from durableruns import Workflow

    wf = Workflow("rates_declared_badly")
    with pytest.raises(DeclarationError, match=r"rates_declared_badly: rate must be .* not '5/d'"):
        wf.step(policy="re_executable", rate="5/d")
    with pytest.raises(DeclarationError, match="rate_key= must be a function of ctx, with a rate="):
        wf.step(policy="re_executable", rate_key=lambda ctx: "dhl")  # no rate to count under
    with pytest.raises(DeclarationError, match="rate_key= must be a function"):
        wf.step(policy="re_executable", rate="5/s", rate_key="dhl")


def test_a_rate_limited_first_step_takes_its_turn_before_its_intent_rides_on_a_claim():
    from durableruns import Workflow
    from durableruns.registry import first_steps

    wf = Workflow("rates_first_step")

    @wf.step(policy="re_executable", rate="3/m", rate_key=lambda ctx: ctx.input["carrier"])
    def rated_first(ctx):
        return {}

    step = wf.get("rated_first")
    assert step.rate == Rate(limit=3, window=timedelta(minutes=1)) and step.rate_key(_Ctx()) == "dhl"
    assert "rates_first_step" not in {name for name, _, _ in first_steps()}


class _Ctx:
    input = {"carrier": "dhl"}  # noqa: RUF012


def test_the_boundary_of_a_run_waiting_for_its_turn_says_whose_limit_and_until_when():
    from durableruns.boundary import StepAttempt, compute_boundary

    until = datetime(2026, 12, 4, 14, 7, 12, tzinfo=UTC)
    done = StepAttempt(step="quote", attempt=1, status="completed")
    b = compute_boundary(("quote", "book_shipment", "notify"), [done], turns={"book_shipment": ("dhl", until)})
    assert b.sentence() == (
        "1 step complete, waiting for the rate limit of book_shipment (key dhl) until 14:07:12, 2 steps remaining"
    )
    cancelled = replace(b, status="cancelled")  # a run that ended meanwhile waits for nothing
    assert "rate limit" not in cancelled.sentence()
    over = compute_boundary(("quote",), [done], turns={"quote": ("", until)})  # a done step waits for no turn
    assert over.turns == {} and over.sentence() == "all 1 step complete"
