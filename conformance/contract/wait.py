"""The one way the suite waits: poll a condition until a deadline, and name the wait that expired.

Scenarios, targets, the bench and the kubelet emulator all wait through this module, so a run
that ran out of time always says which wait it was and what was last seen, and callers catch one
exception type. `WaitExpired` is an AssertionError (a check whose wait expires has failed, not
errored) and a TimeoutError (code that treats any timeout alike keeps working).

An expired wait carries typed fields (`WaitFacts`: what was awaited, from whose view, the
deadline, the last value seen and that value in words), which the check record keeps and the
report turns into a sentence ("Waited 60 s for allocatable > 0: the kubelet still counted 0
allocatable"); the message stays for logs and for code that reads `str(exc)`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# Whose view a wait read: the kubelet's (its node status, allocatable, pod status), the plugin's
# own word (its readiness, its log), the API server's (objects), or the kubelet emulator's.
VIEWS = ("kubelet", "plugin", "API", "emulator")

# Known waits, by the start of their description: whose view, and the last value in words for
# the falsy values a predicate returns. Defined once here so every caller reads alike; a caller
# may pass `view` and `said` itself instead.
_KNOWN: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"^plugin readiness\b|^plugin ready\b"), "plugin",
     "the plugin still said it was not ready"),
    (re.compile(r"^readiness false\b|^not ready\b"), "plugin",
     "the plugin still said it was ready"),
    (re.compile(r"^allocatable > 0\b"), "kubelet", "the kubelet still counted 0 allocatable"),
    (re.compile(r"^allocatable 0\b"), "kubelet", "the kubelet still counted devices allocatable"),
    (re.compile(r"^unready and allocatable 0\b"), "kubelet",
     "the kubelet still counted devices allocatable, or the plugin still said it was ready"),
    (re.compile(r"^(re-)?registration\b|^registered again\b|^the plugin registered\b"), "kubelet",
     "the kubelet still had no new registration"),
    (re.compile(r"^CDI spec byte-exact\b"), "",
     "the spec on disk still differed from the one at node setup"),
    (re.compile(r"^the pod's device (Unhealthy|Healthy)"), "kubelet",
     "the pod's status did not say so yet"),
    (re.compile(r"^pod\b.*\b(running|counting|gone)\b"), "API", "the pod was not seen so yet"),
    (re.compile(r"^DaemonSet\b"), "API", "the DaemonSet had not rolled out yet"),
)  # fmt: skip


@dataclass(frozen=True)
class WaitFacts:
    """What an expired wait knew, as the check record keeps it (results.json `wait`)."""

    awaited: str  # what was awaited, as the caller named it
    view: str  # one of VIEWS, or "" when unknown
    timeout_s: float
    last: str  # the last value seen, as written (repr), "" when none was seen
    seen: str  # the last value in words ("the kubelet still counted 0 allocatable")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def sentence(self) -> str:
        return sentence(self.awaited, self.view, self.timeout_s, self.seen)


_VIEW_WORDS = {
    "kubelet": "as the kubelet sees it",
    "plugin": "as the plugin reports it",
    "API": "as the API server shows it",
    "emulator": "as the kubelet emulator sees it",
}


def sentence(awaited: str, view: str, timeout_s: float, seen: str) -> str:
    """An expired wait in one sentence (no trailing period): what, whose view, how long, and
    what was last seen. Reasons and reports word every expired wait through this."""
    where = f" ({_VIEW_WORDS[view]})" if view in _VIEW_WORDS else ""
    said = f": {seen}" if seen else ""
    return f"waited {timeout_s:g} s for {awaited}{where}{said}"


class WaitExpired(AssertionError, TimeoutError):
    """A wait with a deadline ran out; the message names the wait and the last value seen.

    `facts` holds the typed fields when the wait was made through this module (None for a
    WaitExpired raised with a message only, as older callers do)."""

    def __init__(self, message: str, facts: WaitFacts | None = None) -> None:
        super().__init__(message)
        self.facts = facts


def _known(description: str) -> tuple[str, str]:
    for pattern, view, said in _KNOWN:
        if pattern.search(description):
            return view, said
    return "", ""


def in_words(last: object, said: str = "") -> str:
    """The last value seen, as a reader needs it: a falsy predicate result is 'still not so'."""
    if last is None or last is False or last == 0 or last == "" or last == [] or last == {}:
        return said or "the condition still did not hold"
    if isinstance(last, str):
        return f"last seen: {last}"
    return f"last seen: {last!r}"


def facts(
    description: str, timeout: float, last: object = None, *, view: str = "", said: str = ""
) -> WaitFacts:
    """The typed fields of an expired wait; view and words from the known waits when not given."""
    known_view, known_said = _known(description)
    view = view or known_view
    if view and view not in VIEWS:
        raise ValueError(f"unknown view {view!r}: one of {', '.join(VIEWS)}")
    words = in_words(last, said or known_said)
    shown = "" if last is None else (last if isinstance(last, str) else repr(last))
    return WaitFacts(description, view, float(timeout), shown, words)


def expired(
    description: str, timeout: float, last: object = None, *, view: str = "", said: str = ""
) -> WaitExpired:
    """The exception for an expired wait, worded the same everywhere, with its typed fields."""
    tail = f" (last: {last!r})" if last is not None else ""
    message = f"wait '{description}' expired after {timeout:g}s{tail}"
    return WaitExpired(message, facts(description, timeout, last, view=view, said=said))


def wait_for(
    predicate: Callable[[], T | bool | None],
    timeout: float,
    description: str,
    interval: float = 0.005,
    *,
    view: str = "",
    said: str = "",
) -> T:
    """Poll until predicate returns a truthy value and return it; WaitExpired at the deadline.
    `view` (one of VIEWS) and `said` (the unmet condition in words) make the reason readable."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        value = predicate()
        if value:
            return value  # type: ignore[return-value]
        last = value
        if time.monotonic() >= deadline:
            raise expired(description, timeout, last, view=view, said=said)
        time.sleep(interval)
