"""Every check of the catalogue as one pytest test, with its marker and stable id."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.node import Node
from conformance.pytest_plugin import run_check
from conformance.results import Recorder
from conformance.scenarios import CATALOGUE, Check

# Checks that change the node share one worker and one node, in catalogue order (preservation
# last); the others get a node of their own on another worker.
WORKLOAD_GROUP = {"guest-execution", "atomic-replacement"}


def _params() -> list[Any]:
    params = []
    for check in CATALOGUE:
        group = "workload" if check.id in WORKLOAD_GROUP else "node"
        marks = [getattr(pytest.mark, check.marker), pytest.mark.check_id(check.id),
                 pytest.mark.xdist_group(group)]
        params.append(pytest.param(check.id, id=check.id, marks=marks))
    return params


@pytest.mark.parametrize("check_id", _params())
def test_check(check_id: str, node: Node, check_record: tuple[Check, Recorder]) -> None:
    check, rec = check_record
    assert check.id == check_id
    run_check(node, check, rec)
