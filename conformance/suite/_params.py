"""Build one pytest parameter per check, with its marker and stable id."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.scenarios import CATALOGUE


def check_params(ids: set[str], include: bool) -> list[Any]:
    """Checks whose id is (include=True) or is not (include=False) in ids, in catalogue order."""
    return [
        pytest.param(
            c.id, id=c.id, marks=[getattr(pytest.mark, c.marker), pytest.mark.check_id(c.id)]
        )
        for c in CATALOGUE
        if (c.id in ids) == include
    ]


# Checks that only need a node of their own and leave it as they found it. Every other check
# changes the node, so they share one file: with --dist loadfile they run on one worker, on one
# node, in catalogue order, and preservation (last) sees the aftermath of every fault.
WORKLOAD_CHECKS = {"guest-execution", "atomic-replacement"}
