"""An autouse guard for test modules that start processes: none may outlive its test.

Import `no_leftover_processes` into a test module to apply it there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


def children() -> set[int]:
    """PIDs whose parent is this process (from /proc/*/stat)."""
    kids: set[int] = set()
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid():
            kids.add(int(stat_file.parent.name))
    return kids


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    before = children()
    yield
    assert children() - before == set(), "a test left child processes behind"
