"""Bench runs in this folder hold one machine-wide lock: two benches at once (pytest-xdist puts
each file on its own worker) would skew each other's figures, and each test's check that it left
no /tmp/hvb-* directory behind would see the other run's live one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.machine_lock import machine_lock

LOCK = "/run/lock/hv-bench-tests.lock"


@pytest.fixture(autouse=True)
def one_bench_at_a_time() -> Iterator[None]:
    with machine_lock(LOCK):
        yield
