"""Ledger mount entries with real mounts: a fault's bind stacked on a mount the run did not make
(the real node's own CDI tmpfs) is gone once that mount is on top again, and still present while
the fault's mount stays. Found live: the node target's read-only fault was reported left behind
after it had been undone, because the stack's tmpfs was still at the same path."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hvconform.contract.ledger import Entry, mounts_at, still_present

pytestmark = pytest.mark.root


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def test_a_mount_stacked_on_another_is_judged_by_its_own_layer(tmp_path: Path) -> None:
    point = tmp_path / "cdi"
    point.mkdir()
    _mount("-t", "tmpfs", "-o", "size=1m", "hv-test-base", str(point))
    try:
        below = mounts_at(str(point))
        assert below == 1
        _mount("-t", "tmpfs", "-o", "size=1m,ro", "hv-test-fault", str(point))
        entry = Entry("mount", str(point), "test", f"read-only storage fault below={below}")
        legacy = Entry("mount", str(point), "test", "no count recorded")
        assert still_present(entry) and still_present(legacy)
        subprocess.run(["umount", str(point)], check=True)
        assert not still_present(entry), "the fault's layer is gone; the base is not ours"
        assert still_present(legacy), "without a count, any mount there is a leftover"
    finally:
        while mounts_at(str(point)):
            subprocess.run(["umount", str(point)], check=True)
    assert not still_present(Entry("mount", str(point), "test"))
