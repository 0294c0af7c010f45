"""The bench's plan (sample counts and windows) and its waits, each with a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from hvconform.contract.wait import WaitExpired, wait_for

T = TypeVar("T")


@dataclass(frozen=True)
class Plan:
    """Sample counts and windows of one run; the full plan meets every minimum of issue #7."""

    warmup: int = 3  # discarded samples before each series (caches, the probe helper, grpc)
    cdi_injections: int = 30
    restarts: int = 20
    plugin_restarts: int = 20  # start-up: SIGTERM, then exec -> registered and ready
    refusals: int = 20  # an unusable device behind the path -> Allocate refused
    health_samples: int = 20
    stream_counts: tuple[int, ...] = (1, 10, 100)
    alloc_requests: tuple[tuple[int, int], ...] = ((1, 2000), (16, 8000))
    alloc_warmup: int = 100
    alloc_isolated: int = 200  # one at a time, spaced beyond --probe-max-age: each one probes
    alloc_isolated_gap_s: float = 0.05
    storm_min_reads: int = 100_000
    storm_min_cycles: int = 30
    storm_min_s: float = 5.0  # long enough for several whole-second read rates
    storm_max_s: float = 300.0
    idle_s: float = 60.0
    idle_window_s: float = 10.0
    suite: bool = True
    suite_timeout_s: float = 1800.0
    # Random pause between samples, so no sample stays in phase with a periodic timer.
    gap_s: tuple[float, float] = (0.05, 0.15)
    # --versus: each step runs this many rounds per plugin, alternating (ours, theirs, ...),
    # so machine drift hits both; every round takes 1/rounds of the samples.
    rounds: int = 2


FULL = Plan()
QUICK = Plan(
    warmup=2,
    cdi_injections=10,
    restarts=5,
    plugin_restarts=5,
    refusals=5,
    health_samples=5,
    alloc_requests=((1, 300), (16, 1000)),
    alloc_isolated=30,
    storm_min_reads=20_000,
    storm_min_cycles=10,
    storm_min_s=2.0,
    idle_s=10.0,
    idle_window_s=2.0,
    suite=False,
)


class BenchTimeout(WaitExpired):
    """A bench wait expired; the message names the wait."""

    def __init__(self, what: str, seconds: float, last: object = None) -> None:
        tail = f"; last observed: {last!r}" if last is not None else ""
        super().__init__(f"bench wait for {what} expired after {seconds:g} s{tail}")


async def within(aw: Awaitable[T], seconds: float, what: str) -> T:
    """Await with a deadline; BenchTimeout names `what` when it expires."""
    try:
        async with asyncio.timeout(seconds):
            return await aw
    except TimeoutError:
        raise BenchTimeout(what, seconds) from None


async def poll_until(
    probe: Callable[[], T | None], seconds: float, what: str, interval: float = 0.001
) -> T:
    """Poll a cheap probe until it returns something other than None or False."""
    end = time.monotonic() + seconds
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > end:
            raise BenchTimeout(what, seconds)
        await asyncio.sleep(interval)


def wait_until(probe: Callable[[], T | None], seconds: float, what: str) -> T:
    """Blocking poll, for set-up and tear-down outside the event loop (the suite's one wait)."""
    return wait_for(probe, seconds, f"bench: {what}", interval=0.01)
