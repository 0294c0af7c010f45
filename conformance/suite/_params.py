"""Build one pytest parameter per check, with its marker and stable id."""

from __future__ import annotations

from typing import Any

import pytest

from hvconform.contract import runcontext
from hvconform.scenarios import CATALOGUE, VALIDATE_MARK, Check


def _plugin_api() -> str | None:
    """The API of this run's plugin under test (None outside a run: every check)."""
    try:
        return runcontext.current().plugin.api
    except RuntimeError:
        return None


def check_params(ids: set[str], include: bool) -> list[Any]:
    """Checks whose id is (include=True) or is not (include=False) in ids, in catalogue order;
    in a run, only those judging the API its plugin speaks (a device plugin's run lists no DRA
    check, a driver's no check of the device plugin API: each check says which API it judges)."""
    api = _plugin_api()
    return [
        pytest.param(c.id, id=c.id, marks=_marks(c))
        for c in CATALOGUE
        if (c.id in ids) == include and (api is None or api in c.apis)
    ]


def _marks(check: Check) -> list[pytest.MarkDecorator]:
    """Its category, its id, and the validate mark when the row is in the validate subset."""
    marks = [getattr(pytest.mark, check.marker), pytest.mark.check_id(check.id)]
    if check.validate and check.marker != VALIDATE_MARK:
        marks.append(getattr(pytest.mark, VALIDATE_MARK))
    return marks


# Checks that only need a node of their own and leave it as they found it. Every other check
# changes the node, so they share one file: with --dist loadfile they run on one worker, on one
# node, in catalogue order, and preservation (last) sees the aftermath of every fault.
WORKLOAD_CHECKS = {"guest-execution", "atomic-replacement"}
