"""Device identity checks: lstat, open, fstat and st_rdev comparison.

No gRPC and no asyncio here: the probe helper process imports this module and must start fast.
Every check returns a `CheckResult`; nothing here raises for an expected device problem.
"""

from __future__ import annotations

import enum
import errno
import os
import stat
import time
from dataclasses import dataclass

# O_NOFOLLOW refuses a symlink swapped in after lstat; O_NONBLOCK keeps a FIFO or a tty swapped
# in from blocking the open; O_CLOEXEC keeps the fd out of anything the process ever spawns.
OPEN_FLAGS = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


class DeviceKind(enum.Enum):
    """The hypervisor devices this plugin knows."""

    KVM = "kvm"
    MSHV = "mshv"

    @property
    def path(self) -> str:
        """The conventional device node path, e.g. /dev/kvm."""
        return f"/dev/{self.value}"


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one device check; `reason` is "" when ok, else one line naming the cause."""

    ok: bool
    reason: str
    duration_s: float

    @classmethod
    def passed(cls, started: float) -> CheckResult:
        """A passing result timed from `started` (a time.monotonic() value)."""
        return cls(True, "", time.monotonic() - started)

    @classmethod
    def failed(cls, reason: str, started: float) -> CheckResult:
        """A failing result; newlines in `reason` are folded so it stays one line."""
        one_line = " ".join(reason.split()) or "unknown failure"
        return cls(False, one_line, time.monotonic() - started)


class DeviceCheckError(Exception):
    """An identity check failed; `reason` is the one-line cause."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def describe_oserror(exc: OSError) -> str:
    """'No such file or directory (ENOENT)': strerror plus the symbolic errno name."""
    code = exc.errno
    name = errno.errorcode.get(code, str(code)) if code is not None else "no errno"
    text = os.strerror(code) if code is not None else str(exc)
    return f"{text} ({name})"


def file_type(mode: int) -> str:
    """Human name of the file type in an st_mode."""
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISREG(mode):
        return "regular file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISSOCK(mode):
        return "socket"
    return f"unknown type {stat.S_IFMT(mode):#o}"


def a_file_type(mode: int) -> str:
    """file_type with its article: 'a regular file', 'an unknown type 0o...'."""
    kind = file_type(mode)
    return ("an " if kind[0] in "aeiou" else "a ") + kind


def format_rdev(rdev: int) -> str:
    """'10:232' for a device number."""
    return f"{os.major(rdev)}:{os.minor(rdev)}"


def _lstat_char_device(path: str, label: str) -> os.stat_result:
    """lstat `path` and require a character device; never follows a symlink."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise DeviceCheckError(f"{label}{path} does not exist") from None
    except OSError as exc:
        raise DeviceCheckError(f"cannot lstat {label}{path}: {describe_oserror(exc)}") from None
    if not stat.S_ISCHR(st.st_mode):
        raise DeviceCheckError(f"{label}{path} is not a character device ({file_type(st.st_mode)})")
    return st


def open_verified(device_path: str, host_view_path: str | None) -> int:
    """Check identity and return the open fd that passed it; the caller closes it.

    The fd is returned rather than reopened by path so that the usability probe runs against
    exactly the inode whose identity was checked.

    Raises:
        DeviceCheckError: the path, the host view or the opened fd failed a check.
    """
    device = _lstat_char_device(device_path, "")
    if host_view_path is not None:
        host = _lstat_char_device(host_view_path, "host view ")
        if host.st_rdev != device.st_rdev:
            raise DeviceCheckError(
                f"identity mismatch: {device_path} is {format_rdev(device.st_rdev)} "
                f"but host view {host_view_path} is {format_rdev(host.st_rdev)}"
            )
    try:
        fd = os.open(device_path, OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DeviceCheckError(
                f"{device_path} became a symlink between lstat and open"
            ) from None
        raise DeviceCheckError(
            f"cannot open {device_path} read-write: {describe_oserror(exc)}"
        ) from None
    try:
        opened = os.fstat(fd)
        # A rename between lstat and open would otherwise let another node pass as this one.
        if not stat.S_ISCHR(opened.st_mode):
            raise DeviceCheckError(
                f"{device_path} changed between lstat and open: opened a "
                f"{file_type(opened.st_mode)}"
            )
        if opened.st_rdev != device.st_rdev:
            raise DeviceCheckError(
                f"{device_path} changed between lstat and open: was "
                f"{format_rdev(device.st_rdev)}, opened {format_rdev(opened.st_rdev)}"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_identity(device_path: str, host_view_path: str | None) -> CheckResult:
    """Identity only, in-process: lstat, optional host-view rdev match, open, fstat."""
    started = time.monotonic()
    try:
        fd = open_verified(device_path, host_view_path)
    except DeviceCheckError as exc:
        return CheckResult.failed(exc.reason, started)
    os.close(fd)
    return CheckResult.passed(started)


def check_host_entry(host_view_path: str) -> CheckResult:
    """lstat-only check for the bootstrap device-access mode: a character device, no symlink."""
    started = time.monotonic()
    try:
        _lstat_char_device(host_view_path, "host entry ")
    except DeviceCheckError as exc:
        return CheckResult.failed(exc.reason, started)
    return CheckResult.passed(started)
