"""The node init's kubelet hold (hvconform.contract.nodeinit HOLD_FILE), with real processes:
a kubelet that exits while the hold file exists stays down; removing it starts a new one, as
`systemctl stop/start kubelet` do on kind. The "kubelet" here is a real `sleep` process."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hvconform.contract.nodeinit import HOLD_FILE
from hvconform.contract.wait import wait_for
from hvconform.targets.realnode.nodeinit import RESTART_DELAY_S, Init


@pytest.fixture
def init(tmp_path: Path) -> Iterator[Init]:
    node = Init({"run": str(tmp_path), "kubelet": ["sleep", "1000"]})
    node.start_kubelet()
    loop = threading.Thread(target=node.loop, daemon=True)
    loop.start()
    yield node
    node.stopping = True
    loop.join(10)
    node.stop_kubelet()
    assert not loop.is_alive()


def _pid(init: Init) -> int:
    return int((init.run / "kubelet.pid").read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_held_kubelet_stays_down_until_the_hold_is_removed(init: Init) -> None:
    first = _pid(init)
    (init.run / HOLD_FILE).touch()
    os.kill(first, signal.SIGKILL)  # a crash while held
    wait_for(lambda: init.kubelet is not None and init.kubelet.poll() is not None, 10,
             "the killed kubelet reaped")  # fmt: skip
    # Held: still the dead one several restart delays later (a deadline, not a sleep: the
    # wait ends early only if a new kubelet appears, which is the failure).
    with pytest.raises(AssertionError, match="no new kubelet"):
        wait_for(lambda: _pid(init) != first, RESTART_DELAY_S * 6, "no new kubelet while held")
    assert init.restarts == 0
    (init.run / HOLD_FILE).unlink()
    wait_for(lambda: _pid(init) != first, 10, "a new kubelet once the hold is removed")
    assert _alive(_pid(init)) and init.restarts == 1


def test_without_the_hold_a_crash_is_restarted(init: Init) -> None:
    first = _pid(init)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: _pid(init) != first, 10, "the kubelet started again after a crash")
    assert init.restarts == 1
