"""Results written by a suite before schema 1.3: the one place the report reads words back.

Since 1.3 every timeline event carries its kind and every failure its kind and (a wait) its
typed fields, and reasons hold no Python class name; the report reads those fields. A results
file from an older suite carries some of that only in its text: `read_pre_1_3_check` recovers
it, as the report did before 1.3, so old files read the same. Nothing else in hvconform.report
or hvconform.suite matches a status, reason or event by its text
(tests/report/test_no_text_parsing.py holds that).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hvconform.contract import wait as waits
from hvconform.report.words import Wait

# The schema versions whose files need this module (1.3 and later carry the fields).
PRE_1_3 = frozenset({"1.0", "1.1", "1.2"})


@dataclass(frozen=True)
class Recovered:
    """What a pre-1.3 check record says only in words, as typed fields."""

    said: str  # the reason in words, with no Python class name
    wait: Wait | None
    failure: str  # "wait", "assertion" or "error"
    kinds: list[str]  # each timeline event's kind, in the record's order


def read_pre_1_3_check(raw: Mapping[str, Any]) -> Recovered:
    """The typed fields of a check record written before schema 1.3, from its words where the
    record has no field: the wait from its message, the failure kind from the exception class
    pytest put in the reason, each event's kind from the scenarios' wording of its name."""
    reason = str(raw.get("reason", ""))
    fields = raw.get("wait")
    if isinstance(fields, dict):  # 1.2 wrote the expired wait's fields
        wait: Wait | None = Wait.of(fields)
        said = wait.sentence if wait is not None else ""
    else:
        wait = _wait_from_message(reason)
        said = _reason_in_words(reason, wait)
    failure = str(raw.get("failure", ""))
    if failure not in ("wait", "assertion", "error"):
        if wait is not None:
            failure = "wait"
        else:
            failure = (
                "assertion" if _split_exception(reason)[0] in ("", "AssertionError") else "error"
            )
    kinds = [
        str(e.get("kind") or _kind_from_name(str(e.get("name", ""))))
        for e in raw.get("timeline", [])
        if isinstance(e, dict)
    ]
    return Recovered(said, wait, failure, kinds)


_WAIT = re.compile(
    r"^wait '(?P<what>.+)' expired after (?P<after>[0-9.]+)s \(last: (?P<last>.*)\)$"
)
# pytest reported a failure as "module.ExceptionName: message"; the class told its kind.
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?P<cls>[A-Z]\w*(?:Error|Exception|Expired)): ")


def _split_exception(reason: str) -> tuple[str, str]:
    """("WaitExpired", "wait '...' expired ...") from "hvconform.contract.wait.WaitExpired: wait ..."."""
    text = reason.strip()
    match = _EXCEPTION.match(text)
    return (match["cls"], text[match.end() :]) if match else ("", text)


def _wait_from_message(reason: str) -> Wait | None:
    match = _WAIT.match(_split_exception(reason)[1])
    if match is None:
        return None
    last = match["last"]
    seen = waits.in_words(None if last in ("False", "None", "0", "''", "[]", "{}") else last)
    after = f"{float(match['after']):g} s"
    return Wait(match["what"], "", after, seen, last, f"waited {after} for {match['what']}: {seen}")


def _reason_in_words(reason: str, wait: Wait | None) -> str:
    """The reason with no Python class name: the wait, the assertion's own message, or (any
    other class) that the check could not go on, and why."""
    if wait is not None:
        return wait.sentence
    cls, message = _split_exception(reason)
    if cls in ("", "AssertionError", "WaitExpired"):
        return message
    return f"the check could not go on: {message}"


# The scenarios' wording of timeline events before they carried a kind, checked in this order.
_KIND_WORDS = (
    ("guest", ("fresh guest passed",)),
    ("ready", ("ready (",)),
    (
        "repaired",
        ("byte-exact", "restored", "writable again", "obstruction removed", "re-registered"),
    ),
    ("detected", ("not ready", "unready", "allocatable 0", "readiness false", "refused")),
    ("fault", ("injected", "placed", "removed", "mapped at", "replaced", "read-only", "restart")),
)


def _kind_from_name(name: str) -> str:
    lowered = name.lower()
    for kind, needles in _KIND_WORDS:
        if any(n in lowered for n in needles):
            return kind
    return "info"
