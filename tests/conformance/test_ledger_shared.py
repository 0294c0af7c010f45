"""A shared entry (/run/netns) that another run's last user is just removing is not this run's
leak (issue 27's verdict flake: two suites at once, one saw the other's half-finished cleanup)."""

from __future__ import annotations

import threading
from pathlib import Path

from hvconform.contract.ledger import Entry, survivors

SHARED = "shared; removed by the last user"


def test_an_empty_shared_dir_removed_meanwhile_is_not_a_leak(tmp_path: Path) -> None:
    shared = tmp_path / "netns"
    shared.mkdir()
    entry = Entry("dir", str(shared), "run-a", SHARED)
    timer = threading.Timer(0.3, shared.rmdir)  # the other run's last user, a moment later
    timer.start()
    try:
        assert survivors([entry], settle_s=5.0) == []
    finally:
        timer.cancel()


def test_an_empty_shared_dir_that_stays_is_a_leak(tmp_path: Path) -> None:
    shared = tmp_path / "netns"
    shared.mkdir()
    entry = Entry("dir", str(shared), "run-a", SHARED)
    assert survivors([entry], settle_s=0.3) == [entry]


def test_a_shared_dir_someone_still_uses_is_not_a_leak(tmp_path: Path) -> None:
    shared = tmp_path / "netns"
    shared.mkdir()
    (shared / "other-runs-namespace").touch()
    assert survivors([Entry("dir", str(shared), "run-a", SHARED)], settle_s=0.1) == []
