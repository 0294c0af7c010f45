"""MSHV usability probe: create one non-isolated partition and close it at once.

Facts used, and where they come from (checked against public sources, no code copied):

- include/uapi/linux/mshv.h of mainline Linux (since v6.15; same text in Android bionic's
  libc/kernel/uapi/linux/mshv.h): MSHV_IOCTL is 0xB8; MSHV_CREATE_PARTITION is
  _IOW(MSHV_IOCTL, 0x00, struct mshv_create_partition); that struct is
  { __u64 pt_flags; __u64 pt_isolation; } (16 bytes, documented in later kernels as "the
  initial/v1 version for backward compatibility"); pt_flags is a mask of 1 << MSHV_PT_BIT_*
  with LAPIC = 0, X2APIC = 1, GPA_SUPER_PAGES = 2 (later kernels add
  CPU_AND_XSAVE_FEATURES = 3, which selects the larger struct mshv_create_partition_v2 with
  feature banks); pt_isolation MSHV_PT_ISOLATION_NONE is 0.
- drivers/hv/mshv_root_main.c (mshv_ioctl_process_pt_flags, mshv_dev_ioctl): unknown flag bits
  or isolation values give EINVAL; without the CPU_AND_XSAVE_FEATURES bit only the v1 struct is
  read and the kernel applies its default processor and XSAVE features; the new partition fd is
  O_CLOEXEC and the partition is not initialised in the hypervisor until
  MSHV_INITIALIZE_PARTITION; an unknown request on /dev/mshv gives ENOTTY.
- rust-vmm/mshv mshv-ioctls (src/ioctls/system.rs, Mshv::create_vm; rust-vmm/mshv PR #132
  "Enable x2apic for regular guests"; microsoft/openvmm PR #3270 describes that create_vm as
  always enabling LAPIC and X2APIC): the flag choice below follows that default.
- Pre-mainline out-of-tree headers numbered MSHV_CREATE_PARTITION 0x01 with another struct;
  those kernels are not supported here and fail this probe with a reason.

Only creation is exercised: no MSHV_INITIALIZE_PARTITION, no guest memory, no vCPUs.
"""

from __future__ import annotations

import fcntl
import os
import struct
import time
from collections.abc import Callable

from hv_device_plugin.device import CheckResult, describe_oserror
from hv_device_plugin.probes import IOW, is_new_fd, open_fds

MSHV_IOCTL = 0xB8

MSHV_PT_BIT_LAPIC = 0
MSHV_PT_BIT_X2APIC = 1
MSHV_PT_BIT_GPA_SUPER_PAGES = 2

MSHV_PT_ISOLATION_NONE = 0

# struct mshv_create_partition (v1): two little-endian __u64, no padding.
CREATE_PARTITION_FORMAT = "<QQ"
CREATE_PARTITION_SIZE = struct.calcsize(CREATE_PARTITION_FORMAT)

MSHV_CREATE_PARTITION = IOW(MSHV_IOCTL, 0x00, CREATE_PARTITION_SIZE)

PROBE_PT_FLAGS = (1 << MSHV_PT_BIT_LAPIC) | (1 << MSHV_PT_BIT_X2APIC)


def create_partition_args(
    pt_flags: int = PROBE_PT_FLAGS, pt_isolation: int = MSHV_PT_ISOLATION_NONE
) -> bytes:
    """The v1 MSHV_CREATE_PARTITION argument: kernel-default CPU and XSAVE features."""
    return struct.pack(CREATE_PARTITION_FORMAT, pt_flags, pt_isolation)


def probe_mshv(fd: int, release: Callable[[int], None] = os.close) -> CheckResult:
    """Check that `fd` is a usable MSHV device by creating and closing one partition.

    The caller owns `fd`; the partition fd goes to `release` (os.close: before returning).
    """
    started = time.monotonic()
    # A mutable buffer makes fcntl.ioctl return the call's result (the new fd), not the bytes.
    args = bytearray(create_partition_args())
    before = open_fds()
    try:
        partition_fd = fcntl.ioctl(fd, MSHV_CREATE_PARTITION, args, True)
    except OSError as exc:
        return CheckResult.failed(f"MSHV_CREATE_PARTITION failed: {describe_oserror(exc)}", started)
    if not is_new_fd(partition_fd, before):
        return CheckResult.failed(
            f"MSHV_CREATE_PARTITION returned {partition_fd}, not a new partition fd", started
        )
    release(partition_fd)
    return CheckResult.passed(started)
