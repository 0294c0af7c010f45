"""The one way the suite waits: poll a condition until a deadline, and name the wait that expired.

Scenarios, targets, the bench and the kubelet emulator all wait through this module, so a run
that ran out of time always says which wait it was and what was last seen, and callers catch one
exception type. `WaitExpired` is an AssertionError (a check whose wait expires has failed, not
errored) and a TimeoutError (code that treats any timeout alike keeps working).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitExpired(AssertionError, TimeoutError):
    """A wait with a deadline ran out; the message names the wait and the last value seen."""


def expired(description: str, timeout: float, last: object = None) -> WaitExpired:
    """The exception for an expired wait, worded the same everywhere."""
    tail = f" (last: {last!r})" if last is not None else ""
    return WaitExpired(f"wait '{description}' expired after {timeout:g}s{tail}")


def wait_for(
    predicate: Callable[[], T | bool | None],
    timeout: float,
    description: str,
    interval: float = 0.005,
) -> T:
    """Poll until predicate returns a truthy value and return it; WaitExpired at the deadline."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        value = predicate()
        if value:
            return value  # type: ignore[return-value]
        last = value
        if time.monotonic() >= deadline:
            raise expired(description, timeout, last)
        time.sleep(interval)
