"""ioctl encodings, argument layouts and the KVM/MSHV probes on real devices."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hv_device_plugin.device import check_identity, open_verified
from hv_device_plugin.probes import IO, IOC, IOR, IOW, IOWR, is_new_fd, open_fds
from hv_device_plugin.probes.kvm import KVM_CREATE_VM, KVM_GET_API_VERSION, probe_kvm
from hv_device_plugin.probes.mshv import (
    CREATE_PARTITION_SIZE,
    MSHV_CREATE_PARTITION,
    MSHV_PT_ISOLATION_NONE,
    PROBE_PT_FLAGS,
    create_partition_args,
    probe_mshv,
)

NULL_RDEV = os.makedev(1, 3)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
needs_kvm = pytest.mark.skipif(
    not (Path("/dev/kvm").exists() and stat.S_ISCHR(os.lstat("/dev/kvm").st_mode)),
    reason="no /dev/kvm character device",
)


def test_kvm_numbers_match_hand_encoding() -> None:
    # _IO: dir 0, size 0, type 0xAE in bits 8..15, nr in bits 0..7.
    assert KVM_GET_API_VERSION == (0xAE << 8) | 0x00 == 0xAE00
    assert KVM_CREATE_VM == (0xAE << 8) | 0x01 == 0xAE01


def test_mshv_create_partition_matches_hand_encoding() -> None:
    # _IOW: dir WRITE (1) in bits 30..31, size 16 in bits 16..29, type 0xB8, nr 0x00.
    by_hand = (1 << 30) | (16 << 16) | (0xB8 << 8) | 0x00
    assert by_hand == 0x4010B800
    assert by_hand == MSHV_CREATE_PARTITION


def test_encoding_agrees_with_well_known_kvm_numbers() -> None:
    assert IO(0xAE, 0x80) == 0xAE80  # KVM_RUN
    assert IOW(0xAE, 0x46, 32) == 0x4020AE46  # KVM_SET_USER_MEMORY_REGION
    assert IOR(0xAE, 0x81, 144) == 0x8090AE81  # KVM_GET_REGS
    assert IOWR(0xAE, 0x05, 8) == 0xC008AE05  # KVM_GET_SUPPORTED_CPUID


@pytest.mark.parametrize(
    ("direction", "ioctl_type", "nr", "size"),
    [(4, 0, 0, 0), (0, 0x100, 0, 0), (0, 0, 0x100, 0), (0, 0, 0, 1 << 14), (0, -1, 0, 0)],
)
def test_encoding_refuses_overflowing_fields(
    direction: int, ioctl_type: int, nr: int, size: int
) -> None:
    with pytest.raises(ValueError, match="does not fit"):
        IOC(direction, ioctl_type, nr, size)


def test_create_partition_layout_is_16_bytes_little_endian() -> None:
    assert CREATE_PARTITION_SIZE == 16
    packed = create_partition_args(0x0102030405060708, 0x1112131415161718)
    assert packed == bytes.fromhex("08070605040302011817161514131211")
    default = create_partition_args()
    assert len(default) == 16
    assert default[:8] == PROBE_PT_FLAGS.to_bytes(8, "little")
    assert default[8:] == MSHV_PT_ISOLATION_NONE.to_bytes(8, "little") == bytes(8)
    # LAPIC and X2APIC only; bit 3 (CPU_AND_XSAVE_FEATURES) would ask for the v2 struct.
    assert PROBE_PT_FLAGS == 0b011


def test_is_new_fd_rejects_existing_descriptors() -> None:
    before = open_fds()
    assert {0, 1, 2} <= before
    assert not is_new_fd(0, before)
    assert not is_new_fd(-1, before)
    fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    try:
        assert is_new_fd(fd, before)
    finally:
        os.close(fd)
    assert not is_new_fd(fd, before)


@needs_kvm
def test_kvm_probe_passes_on_real_kvm_without_leaking_fds() -> None:
    fd = open_verified("/dev/kvm", "/dev/kvm")
    try:
        before = open_fds()
        for _ in range(20):
            result = probe_kvm(fd)
            assert result.ok, result.reason
            assert result.reason == ""
        assert open_fds() == before
    finally:
        os.close(fd)


def test_kvm_probe_refuses_dev_null() -> None:
    fd = open_verified("/dev/null", None)
    try:
        result = probe_kvm(fd)
    finally:
        os.close(fd)
    assert not result.ok
    assert result.reason == ("KVM_GET_API_VERSION failed: Inappropriate ioctl for device (ENOTTY)")


@needs_root
def test_existing_unusable_device_passes_identity_but_fails_probe(tmp_path: Path) -> None:
    # The seed's case: /dev/null's numbers mapped at the device path, matching host view.
    device = tmp_path / "dev" / "kvm"
    host = tmp_path / "host-dev" / "kvm"
    for node in (device, host):
        node.parent.mkdir(parents=True)
        os.mknod(node, stat.S_IFCHR | 0o600, NULL_RDEV)
    assert check_identity(str(device), str(host)).ok
    fd = open_verified(str(device), str(host))
    try:
        kvm = probe_kvm(fd)
        mshv = probe_mshv(fd)
    finally:
        os.close(fd)
    assert not kvm.ok
    assert kvm.reason.startswith("KVM_GET_API_VERSION failed")
    assert not mshv.ok
    assert mshv.reason.startswith("MSHV_CREATE_PARTITION failed")


def test_mshv_probe_refuses_dev_null() -> None:
    fd = open_verified("/dev/null", None)
    try:
        before = open_fds()
        result = probe_mshv(fd)
        assert open_fds() == before
    finally:
        os.close(fd)
    assert not result.ok
    assert result.reason == (
        "MSHV_CREATE_PARTITION failed: Inappropriate ioctl for device (ENOTTY)"
    )


@needs_kvm
def test_mshv_probe_refuses_kvm() -> None:
    fd = open_verified("/dev/kvm", None)
    try:
        result = probe_mshv(fd)
    finally:
        os.close(fd)
    assert not result.ok
    assert result.reason.startswith("MSHV_CREATE_PARTITION failed: ")


@pytest.mark.mshv_live
def test_mshv_live_partition_creation() -> None:
    """Opt-in: HV_TEST_MSHV_LIVE=1 demands a real /dev/mshv and FAILS without one."""
    if os.environ.get("HV_TEST_MSHV_LIVE") != "1":
        pytest.skip("live MSHV test not requested: set HV_TEST_MSHV_LIVE=1 on an MSHV host")
    assert os.path.lexists("/dev/mshv"), "HV_TEST_MSHV_LIVE=1 but /dev/mshv is absent"
    identity = check_identity("/dev/mshv", None)
    assert identity.ok, identity.reason
    fd = open_verified("/dev/mshv", None)
    try:
        before = open_fds()
        result = probe_mshv(fd)
        assert open_fds() == before, "partition fd leaked"
    finally:
        os.close(fd)
    assert result.ok, result.reason
