"""TwoPhase around a node's life, and snapshots of real nodes (mknod copies, never /dev/kvm)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from hvconform.metadata.rules import MetadataInputError, snapshot
from hvconform.metadata.twophase import CHECK_ID, TwoPhase

pytestmark = [pytest.mark.root]


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A character device with the real /dev/kvm's numbers, root-only like the host's."""
    path = tmp_path / "kvm"
    os.mknod(path, stat.S_IFCHR | 0o600, os.stat("/dev/kvm").st_rdev)
    path.chmod(0o600)
    return path


def test_snapshot_of_real_nodes(node: Path, tmp_path: Path) -> None:
    real = os.stat("/dev/kvm")
    snap = snapshot(str(node))
    assert (snap.kind, snap.major, snap.minor) == (
        "char",
        os.major(real.st_rdev),
        os.minor(real.st_rdev),
    )
    assert (snap.mode, snap.uid, snap.gid) == (0o600, 0, 0)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(node)
    assert snapshot(str(fifo)).kind == "fifo"
    assert snapshot(str(link)).kind == "symlink"  # lstat: a symlink to a device is not one
    assert snapshot(str(tmp_path / "absent")).kind == "missing"
    assert snapshot(str(node / "below-a-device")).kind == "missing"  # ENOTDIR
    with pytest.raises(MetadataInputError):
        snapshot("relative/kvm")


def test_local_target_without_udev_expects_unchanged(node: Path) -> None:
    tp = TwoPhase(device=str(node))
    tp.snapshot_original()
    assert tp.check_startup(None).status == "accepted"
    assert tp.check_final().status == "accepted"
    summary = tp.summary()
    assert summary["check"] == CHECK_ID and summary["passed"]
    assert json.loads(json.dumps(summary)) == summary
    assert summary["startup"]["verdict"]["reference"] == "original"
    assert summary["final"]["verdict"]["reference"] == "validated"


def test_without_udev_a_gid_change_is_rejected(node: Path) -> None:
    tp = TwoPhase(device=str(node))
    tp.snapshot_original()
    os.chown(node, -1, 4242)
    verdict = tp.check_startup()
    assert verdict.status == "rejected"
    assert verdict.message.startswith("rejected: gid changed 0 -> 4242 at startup")
    assert "no udev" in verdict.message
    assert tp.validated is None


@pytest.mark.parametrize("node_gid", [4242, "kvm:x:4242:\n"])
def test_node_kvm_group_as_gid_or_lookup(node: Path, node_gid: int | str) -> None:
    tp = TwoPhase(device=str(node))
    original = tp.snapshot_original()
    os.chown(node, -1, 4242)
    assert tp.check_startup(node_gid).status == "accepted"
    assert tp.node_kvm_gid == 4242 and tp.validated is not None and tp.validated.gid == 4242
    assert tp.check_final().status == "accepted"
    assert original.gid is not None
    os.chown(node, -1, original.gid)
    final = tp.check_final()
    assert final.status == "rejected" and final.reference == "validated"
    assert not tp.passed


@pytest.mark.parametrize("lookup", ["", "kvm:x:abc:", "docker:x:4242:", "kvm:x:0:"])
def test_a_bad_lookup_is_an_error_and_final_uses_the_original(node: Path, lookup: str) -> None:
    tp = TwoPhase(device=str(node))
    tp.snapshot_original()
    os.chown(node, -1, 4242)
    startup = tp.check_startup(lookup)
    assert startup.status == "error" and startup.exit_code == 2
    assert tp.validated is None
    final = tp.check_final()
    assert final.status == "rejected" and final.reference == "original"
    assert "(startup validation did not complete)" in final.message
    os.chown(node, -1, 0)
    assert tp.check_final().status == "accepted"
    assert not tp.summary()["passed"]


def test_bool_is_not_a_node_gid(node: Path) -> None:
    tp = TwoPhase(device=str(node))
    tp.snapshot_original()
    assert tp.check_startup(True).status == "error"


def test_missing_and_replaced_devices_are_rejected_in_both_phases(node: Path) -> None:
    tp = TwoPhase(device=str(node))
    tp.snapshot_original()
    node.unlink()
    assert "is missing" in tp.check_startup(None).message
    assert "is missing" in tp.check_final().message
    node.write_text("not a device")
    assert tp.check_startup(None).message.startswith("rejected: type changed char -> file")
    assert tp.check_final().status == "rejected"


def test_phases_before_the_original_snapshot_are_errors(node: Path) -> None:
    tp = TwoPhase(device=str(node))
    assert tp.check_startup(None).status == "error"
    assert tp.check_final().status == "error"
    summary = tp.summary()
    assert summary["original"] is None and not summary["passed"]


def test_agrees_with_the_local_target_metadata(node: Path) -> None:
    from hvconform.targets.host.hostfiles import device_metadata

    snap = snapshot(str(node)).to_json()
    expected = {**device_metadata(str(node)), "mode": f"{0o600:04o}"}
    assert {k: snap[k] for k in expected} == expected
