"""Usability probes that run inside the probe helper process, plus the ioctl number encoding.

The encoding is the Linux asm-generic one (include/uapi/asm-generic/ioctl.h), used by x86-64 and
arm64, the architectures KVM and MSHV hosts run on. Helper names mirror the C macros (_IO, _IOW)
so each number can be reviewed line by line against its kernel header.
"""

from __future__ import annotations

import os

# Field widths and positions of a request number: | dir:2 | size:14 | type:8 | nr:8 |.
IOC_NRBITS = 8
IOC_TYPEBITS = 8
IOC_SIZEBITS = 14
IOC_DIRBITS = 2

IOC_NRSHIFT = 0
IOC_TYPESHIFT = IOC_NRSHIFT + IOC_NRBITS
IOC_SIZESHIFT = IOC_TYPESHIFT + IOC_TYPEBITS
IOC_DIRSHIFT = IOC_SIZESHIFT + IOC_SIZEBITS

# Direction is seen from user space: WRITE means the kernel reads the argument.
IOC_NONE = 0
IOC_WRITE = 1
IOC_READ = 2


def IOC(direction: int, ioctl_type: int, nr: int, size: int) -> int:
    """Encode an ioctl request number; refuses fields that would overflow their bits."""
    for name, value, bits in (
        ("direction", direction, IOC_DIRBITS),
        ("type", ioctl_type, IOC_TYPEBITS),
        ("nr", nr, IOC_NRBITS),
        ("size", size, IOC_SIZEBITS),
    ):
        if not 0 <= value < (1 << bits):
            raise ValueError(f"ioctl {name} {value:#x} does not fit in {bits} bits")
    return (
        (direction << IOC_DIRSHIFT)
        | (ioctl_type << IOC_TYPESHIFT)
        | (nr << IOC_NRSHIFT)
        | (size << IOC_SIZESHIFT)
    )


def IO(ioctl_type: int, nr: int) -> int:
    """_IO: no argument is transferred."""
    return IOC(IOC_NONE, ioctl_type, nr, 0)


def IOW(ioctl_type: int, nr: int, size: int) -> int:
    """_IOW: user space passes `size` bytes to the kernel."""
    return IOC(IOC_WRITE, ioctl_type, nr, size)


def IOR(ioctl_type: int, nr: int, size: int) -> int:
    """_IOR: the kernel returns `size` bytes to user space."""
    return IOC(IOC_READ, ioctl_type, nr, size)


def IOWR(ioctl_type: int, nr: int, size: int) -> int:
    """_IOWR: `size` bytes go both ways."""
    return IOC(IOC_READ | IOC_WRITE, ioctl_type, nr, size)


def fd_is_open(fd: int) -> bool:
    """True when `fd` is an open descriptor of this process."""
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def open_fds() -> frozenset[int]:
    """File descriptors open in this process (Linux /proc/self/fd)."""
    with os.scandir("/proc/self/fd") as entries:
        listed = [int(entry.name) for entry in entries]
    # The listing includes the directory's own fd, closed by the time we look again.
    return frozenset(fd for fd in listed if fd_is_open(fd))


def is_new_fd(value: int, before: frozenset[int]) -> bool:
    """True when an ioctl's return value is an fd that did not exist before the call.

    A driver that answers an unknown request with 0 (or any small number) must not make the probe
    pass, nor make it close one of this process's own descriptors such as stdin.
    """
    return value >= 0 and value not in before and fd_is_open(value)
