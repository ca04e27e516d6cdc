"""Timing helpers shared by the benchmark modules.

Each measurement runs a function several times with ``time.perf_counter`` and
reduces the per-repetition figures to a small dict of order statistics, so the
runner can compare medians and see the spread without keeping raw samples.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, TypeVar

Summary = dict[str, float]
T = TypeVar("T")


def _no_setup() -> None:
    return None


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One thing to time: ``run(prepared)`` performs ``ops`` operations on what ``setup()`` returned (untimed)."""

    name: str
    run: Callable[[Any], Any]
    ops: int = 1
    setup: Callable[[], Any] = _no_setup

    def seconds(self) -> float:
        """Seconds of one timed call, after its untimed setup."""
        prepared = self.setup()
        t0 = time.perf_counter()
        self.run(prepared)
        return time.perf_counter() - t0


def percentile(samples: Sequence[float], q: float) -> float:
    """Percentile ``q`` (0..100) of ``samples`` with linear interpolation between ranks."""
    if not samples:
        raise ValueError("percentile of an empty sample")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile out of range: {q}")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return float(ordered[lo])
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def summarize(samples: Sequence[float]) -> Summary:
    """Median, p10, p90, min, max and count of ``samples``."""
    if not samples:
        raise ValueError("summarize of an empty sample")
    return {
        "median": percentile(samples, 50.0),
        "p10": percentile(samples, 10.0),
        "p90": percentile(samples, 90.0),
        "min": float(min(samples)),
        "max": float(max(samples)),
        "n": float(len(samples)),
    }


def measure(
    fn: Callable[..., Any],
    *,
    repeat: int,
    warmup: int = 1,
    ops: int = 1,
    scale: float = 1e3,
    setup: Optional[Callable[[], Any]] = None,
) -> Summary:
    """Time ``fn`` ``repeat`` times (after ``warmup`` untimed calls) and summarize.

    Each sample is ``elapsed_seconds / ops * scale``: with the defaults it is
    milliseconds per operation when ``fn`` performs ``ops`` operations per call.
    If ``setup`` is given it runs untimed before every call (warmups included)
    and its return value is passed to ``fn`` as the only argument.
    """
    workload = Workload(name=getattr(fn, "__name__", "fn"), ops=ops,
                        run=fn if setup is not None else (lambda _: fn()), setup=setup or _no_setup)
    return interleave([workload], repeat=repeat, warmup=warmup, scale=scale)[workload.name]


def interleave(workloads: Sequence[Workload], *, repeat: int, warmup: int = 1, scale: float = 1e3
               ) -> dict[str, Summary]:
    """Time every workload once per round, ``repeat`` rounds, rotating the order (A B C, B C A, C A B, ...).

    Side by side in rounds, a load that drifts during the run (another job on the machine) hits every
    workload alike, so the ratios of their medians stay honest even when the absolute figures move. Each
    sample is seconds per operation times ``scale`` (milliseconds by default).
    """
    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    if any(w.ops < 1 for w in workloads):
        raise ValueError("ops must be at least 1")
    if len({w.name for w in workloads}) != len(workloads):
        raise ValueError("workload names must be unique")
    for w in workloads:
        for _ in range(warmup):
            w.seconds()
    samples: dict[str, list[float]] = {w.name: [] for w in workloads}
    for _, w in rotation(workloads, repeat):
        samples[w.name].append(w.seconds() / w.ops * scale)
    return {name: summarize(values) for name, values in samples.items()}


def rotation(items: Sequence[T], rounds: int) -> Iterator[tuple[int, T]]:
    """``(round, item)`` for ``rounds`` rounds over ``items``, each round starting one further along."""
    for round_no in range(rounds):
        shift = round_no % len(items) if items else 0
        for item in [*items[shift:], *items[:shift]]:
            yield round_no, item


def ratio(numerator: Summary, denominator: Summary) -> Summary:
    """Ratio of two summaries' medians, with a conservative spread.

    ``low`` pairs the numerator's p10 with the denominator's p90 and ``high``
    pairs the numerator's p90 with the denominator's p10, so the true ratio of
    typical values lies in [low, high] unless either side is an outlier run.
    """
    if denominator["median"] <= 0 or denominator["p10"] <= 0:
        raise ValueError("denominator summary must be positive")
    return {
        "ratio": numerator["median"] / denominator["median"],
        "low": numerator["p10"] / denominator["p90"],
        "high": numerator["p90"] / denominator["p10"],
    }


def rounded(value: Any, digits: int = 4) -> Any:
    """Round every float in a nested dict/list structure (for printing JSON)."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value


def main(argv: Optional[list[str]] = None) -> None:
    """Demo: time a 1 ms sleep, to see the helpers' output and the timer's overhead."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--ops", type=int, default=20)
    args = parser.parse_args(argv)

    def sleeps() -> None:
        for _ in range(args.ops):
            time.sleep(0.001)

    def noop() -> None:
        for _ in range(args.ops):
            pass

    sleep = measure(sleeps, repeat=args.repeat, ops=args.ops)
    empty = measure(noop, repeat=args.repeat, ops=args.ops, scale=1e6)
    print(json.dumps(rounded({"ms_per_1ms_sleep": sleep, "us_per_empty_iteration": empty}), indent=2))


if __name__ == "__main__":
    main()
