"""KVM usability probe: the API version, then create and destroy one empty VM.

Facts from include/uapi/linux/kvm.h: KVMIO is 0xAE; KVM_GET_API_VERSION is _IO(KVMIO, 0x00)
and returns 12 on every kernel since 2.6.22; KVM_CREATE_VM is _IO(KVMIO, 0x01) with the machine
type as its integer argument (0 is the default type) and returns a new VM fd.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable

from hv_device_plugin.device import CheckResult, describe_oserror
from hv_device_plugin.probes import IO, is_new_fd, open_fds

KVMIO = 0xAE
KVM_GET_API_VERSION = IO(KVMIO, 0x00)
KVM_CREATE_VM = IO(KVMIO, 0x01)

KVM_API_VERSION = 12
KVM_VM_TYPE_DEFAULT = 0


def probe_kvm(fd: int, release: Callable[[int], None] = os.close) -> CheckResult:
    """Check that `fd` is a usable KVM device: API version 12 and KVM_CREATE_VM succeeds.

    No memory, no vCPUs; the VM fd goes to `release` (os.close: closed at once). The caller
    owns `fd`.
    """
    started = time.monotonic()
    try:
        version = fcntl.ioctl(fd, KVM_GET_API_VERSION, 0)
    except OSError as exc:
        return CheckResult.failed(f"KVM_GET_API_VERSION failed: {describe_oserror(exc)}", started)
    # A non-KVM driver may accept the number and return anything; only 12 means KVM.
    if version != KVM_API_VERSION:
        return CheckResult.failed(
            f"KVM_GET_API_VERSION returned {version}, want {KVM_API_VERSION}", started
        )
    before = open_fds()
    try:
        vm_fd = fcntl.ioctl(fd, KVM_CREATE_VM, KVM_VM_TYPE_DEFAULT)
    except OSError as exc:
        return CheckResult.failed(f"KVM_CREATE_VM failed: {describe_oserror(exc)}", started)
    if not is_new_fd(vm_fd, before):
        return CheckResult.failed(f"KVM_CREATE_VM returned {vm_fd}, not a new VM fd", started)
    release(vm_fd)
    return CheckResult.passed(started)
