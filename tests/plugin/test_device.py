"""Identity checks against real nodes: mknod'd character devices, FIFOs, files, symlinks."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from hv_device_plugin.device import (
    CheckResult,
    DeviceKind,
    check_host_entry,
    check_identity,
    file_type,
    open_verified,
)

KVM_RDEV = os.makedev(10, 232)
NULL_RDEV = os.makedev(1, 3)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
needs_kvm = pytest.mark.skipif(
    not (Path("/dev/kvm").exists() and stat.S_ISCHR(os.lstat("/dev/kvm").st_mode)),
    reason="no /dev/kvm character device",
)


def make_char(path: Path, rdev: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | 0o600, rdev)
    return path


def fingerprint(path: Path) -> tuple[int, ...]:
    st = os.lstat(path)
    return (
        st.st_mode,
        st.st_uid,
        st.st_gid,
        st.st_rdev,
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
    )


def make_refused(kind: str, path: Path) -> None:
    """Create a non-character-device entry of the given kind at `path`."""
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "regular file":
        path.write_text("not a device\n")
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink":
        target = make_char(path.parent / "symlink-target", KVM_RDEV)
        path.symlink_to(target)
    elif kind == "block device":
        os.mknod(path, stat.S_IFBLK | 0o600, os.makedev(7, 0))
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
    else:
        raise AssertionError(kind)


REFUSED_KINDS = ["FIFO", "regular file", "directory", "symlink", "block device", "socket"]


def test_device_kind_paths() -> None:
    assert DeviceKind.KVM.path == "/dev/kvm"
    assert DeviceKind.MSHV.path == "/dev/mshv"
    assert DeviceKind("mshv") is DeviceKind.MSHV


def test_failed_result_is_one_line() -> None:
    result = CheckResult.failed("first\nsecond\n", 0.0)
    assert not result.ok
    assert result.reason == "first second"
    assert result.duration_s >= 0


def test_file_type_names() -> None:
    assert file_type(stat.S_IFCHR) == "character device"
    assert file_type(stat.S_IFLNK) == "symlink"
    assert file_type(stat.S_IFIFO) == "FIFO"


@needs_root
@needs_kvm
def test_identity_passes_for_matching_kvm_numbers(tmp_path: Path) -> None:
    device = make_char(tmp_path / "dev" / "kvm", KVM_RDEV)
    host = make_char(tmp_path / "host-dev" / "kvm", KVM_RDEV)
    result = check_identity(str(device), str(host))
    assert result == CheckResult(True, "", result.duration_s)
    assert result.duration_s < 1.0


@needs_kvm
def test_identity_passes_on_real_kvm_without_host_view() -> None:
    assert check_identity("/dev/kvm", None).ok
    assert check_identity("/dev/kvm", "/dev/kvm").ok


@needs_root
def test_identity_mismatch_names_both_numbers(tmp_path: Path) -> None:
    device = make_char(tmp_path / "dev" / "kvm", NULL_RDEV)
    host = make_char(tmp_path / "host-dev" / "kvm", KVM_RDEV)
    result = check_identity(str(device), str(host))
    assert not result.ok
    assert result.reason == (f"identity mismatch: {device} is 1:3 but host view {host} is 10:232")


@needs_root
def test_open_verified_returns_the_checked_fd(tmp_path: Path) -> None:
    device = make_char(tmp_path / "dev" / "null-numbers", NULL_RDEV)
    fd = open_verified(str(device), str(device))
    try:
        opened = os.fstat(fd)
        assert stat.S_ISCHR(opened.st_mode)
        assert opened.st_rdev == NULL_RDEV
        assert os.get_inheritable(fd) is False
        assert os.get_blocking(fd) is False
    finally:
        os.close(fd)


@needs_root
@pytest.mark.parametrize("kind", REFUSED_KINDS)
def test_device_path_of_wrong_type_is_refused(tmp_path: Path, kind: str) -> None:
    device = tmp_path / "kvm"
    make_refused(kind, device)
    host = make_char(tmp_path / "host-dev" / "kvm", KVM_RDEV)
    result = check_identity(str(device), str(host))
    assert not result.ok
    assert result.reason == f"{device} is not a character device ({kind})"


@needs_root
@pytest.mark.parametrize("kind", REFUSED_KINDS)
def test_host_view_of_wrong_type_is_refused(tmp_path: Path, kind: str) -> None:
    device = make_char(tmp_path / "dev" / "kvm", KVM_RDEV)
    host = tmp_path / "host-kvm"
    make_refused(kind, host)
    result = check_identity(str(device), str(host))
    assert not result.ok
    assert result.reason == f"host view {host} is not a character device ({kind})"


@needs_root
def test_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = make_char(tmp_path / "real" / "kvm", KVM_RDEV)
    regular = tmp_path / "real" / "file"
    regular.write_text("keep me\n")
    before = {path: fingerprint(path) for path in (target, regular)}
    for victim in (target, regular):
        link = tmp_path / f"link-to-{victim.name}"
        link.symlink_to(victim)
        result = check_identity(str(link), None)
        assert result.reason == f"{link} is not a character device (symlink)"
        assert check_host_entry(str(link)).reason == (
            f"host entry {link} is not a character device (symlink)"
        )
    assert {path: fingerprint(path) for path in (target, regular)} == before
    assert regular.read_text() == "keep me\n"


@needs_kvm
def test_symlink_to_real_kvm_is_refused_and_kvm_untouched(tmp_path: Path) -> None:
    before = fingerprint(Path("/dev/kvm"))
    link = tmp_path / "kvm"
    link.symlink_to("/dev/kvm")
    result = check_identity(str(link), "/dev/kvm")
    assert not result.ok
    assert result.reason.endswith("(symlink)")
    assert fingerprint(Path("/dev/kvm")) == before


def test_missing_paths_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    assert check_identity(str(missing), None).reason == f"{missing} does not exist"
    assert check_host_entry(str(missing)).reason == f"host entry {missing} does not exist"
    if Path("/dev/null").exists():
        result = check_identity("/dev/null", str(missing))
        assert result.reason == f"host view {missing} does not exist"


@needs_root
def test_host_entry_accepts_character_device_only(tmp_path: Path) -> None:
    entry = make_char(tmp_path / "host-dev" / "kvm", KVM_RDEV)
    assert check_host_entry(str(entry)).ok
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert (
        check_host_entry(str(fifo)).reason == f"host entry {fifo} is not a character device (FIFO)"
    )


@needs_root
def test_unopenable_device_reports_open_error(tmp_path: Path) -> None:
    # A node whose major has no driver: lstat passes, open fails with ENXIO or ENODEV.
    device = make_char(tmp_path / "dev" / "nodriver", os.makedev(240, 254))
    result = check_identity(str(device), None)
    assert not result.ok
    assert result.reason.startswith(f"cannot open {device} read-write: ")
