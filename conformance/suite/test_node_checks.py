"""Checks that inject faults into one node, in catalogue order; preservation runs last."""

from __future__ import annotations

import pytest

from hvconform.contract.node import Node
from hvconform.contract.results import Recorder
from hvconform.scenarios import Check
from hvconform.suite._params import WORKLOAD_CHECKS, check_params
from hvconform.suite.pytest_plugin import run_check


@pytest.mark.parametrize("check_id", check_params(WORKLOAD_CHECKS, include=False))
def test_check(check_id: str, node: Node, check_record: tuple[Check, Recorder]) -> None:
    check, rec = check_record
    assert check.id == check_id
    run_check(node, check, rec)
