"""How each test phase ended, as typed fields: status, reason and (a failure) its kind and wait.

pytest only runs the checks. What ended a phase is read from the exception object itself (its
class and its fields), on the worker that ran it, and travels to the controller as a
`user_properties` entry of the phase's report (JSON of the fields). A status other than passed or
failed is an `Outcome` (NotApplicable, EnvironmentBlocked, Blocked): the suite raises pytest's
skip *from* it, so the skip's text is only pytest's display and the status is the cause's field.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

import pytest

from hvconform.contract.results import Outcome, Status, describe_failure

PROP = "hv_outcome"
# An outcome decided before the item ran (preflight's environment_blocked skip marker).
STASHED = pytest.StashKey[Outcome]()


def skip(outcome: Outcome) -> NoReturn:
    """Skip the running test as `outcome`; pytest shows "<status>: <reason>"."""
    raise pytest.skip.Exception(f"{outcome.status.value}: {outcome.reason}") from outcome


def of_call(item: pytest.Item, call: pytest.CallInfo[None]) -> dict[str, Any] | None:
    """The typed fields of what ended this phase; None when it ended without an exception."""
    if call.excinfo is None:
        return None
    exc = call.excinfo.value
    if isinstance(exc, pytest.skip.Exception):
        cause = (
            exc.__cause__ if isinstance(exc.__cause__, Outcome) else item.stash.get(STASHED, None)
        )
        if cause is not None:
            return {"status": cause.status.value, "reason": cause.reason}
        # A skip nobody typed (a plain pytest.skip or skip marker): its message as given.
        return {"status": Status.SKIPPED.value, "reason": exc.msg or "skipped"}
    failure, reason, wait = describe_failure(exc)
    return {
        "status": Status.FAILED.value,
        "reason": reason,
        "failure": failure,
        **({"wait": wait} if wait is not None else {}),
    }


def attach(report: pytest.TestReport, found: dict[str, Any]) -> None:
    """Onto this report only: pytest hands every phase's report the item's own list."""
    report.user_properties = [*report.user_properties, (PROP, json.dumps(found))]


def read(report: pytest.TestReport) -> dict[str, Any] | None:
    raw = dict(report.user_properties).get(PROP)
    if not isinstance(raw, str):
        return None
    found: dict[str, Any] = json.loads(raw)
    return found
