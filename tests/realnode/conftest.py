"""One real node per machine: the tests here that bring up the node stack (the node target,
cluster-mode nodes, the differential run) share the host's /var/lib/kubelet, /run/hv-node and
ports, so pytest-xdist (each file on its own worker) must never run two of them at once. Without
this lock a second file skipped ("a node is already up") or broke the first one's teardown.
A module opts in with `USES_NODE_STACK = True` (the unit tests here need no lock)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.machine_lock import machine_lock

LOCK = "/run/lock/hv-node-tests.lock"


@pytest.fixture(scope="module", autouse=True)
def one_node_stack_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    if not getattr(request.module, "USES_NODE_STACK", False):
        yield
        return
    with machine_lock(LOCK):
        yield
