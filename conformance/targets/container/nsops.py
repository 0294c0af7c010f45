"""Mount and device-node changes inside a container's mount namespace, with no tool inside it.

A container's mount namespace has its own root (pivot_root), so `nsenter -m mount ...` runs the
container's own `mount`, which an image holding one static binary does not have. This helper is
run as its own process (`python -I nsops.py PID OP ARGS`): it opens what it needs from the host
first (a bind source is cloned with open_tree(2) while the host's tree is still visible), then
setns(2)es into the mount namespace of PID (a single-threaded process may) and makes the change
with system calls: move_mount(2) attaches the clone at the target as the container sees it.
Standard library only, nothing imported after setns. Exit 0, or 1 with one line on stderr.

  bind SRC DST           bind host path SRC over DST (a directory or a file) in the container
  umount DST [lazy]      detach the topmost mount at DST (lazily: MNT_DETACH)
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Sequence

CLONE_NEWNS = 0x00020000
# The new mount API's numbers are the same on every architecture Linux added them for (>= 5.2).
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 0x00000004
MNT_DETACH = 2


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def run(argv: Sequence[str]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    pid, op, args = int(argv[0]), argv[1], list(argv[2:])
    source = -1
    if op == "bind":
        flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE
        source = _check(
            libc.syscall(SYS_OPEN_TREE, AT_FDCWD, args[0].encode(), flags), f"open_tree {args[0]}"
        )
    ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(libc.setns(ns, CLONE_NEWNS), f"setns into the mount namespace of {pid}")
    finally:
        os.close(ns)
    if op == "bind":
        _check(
            libc.syscall(
                SYS_MOVE_MOUNT, source, b"", AT_FDCWD, args[1].encode(), MOVE_MOUNT_F_EMPTY_PATH
            ),
            f"move_mount {args[0]} to {args[1]}",
        )
    elif op == "umount":
        flags = MNT_DETACH if args[1:] == ["lazy"] else 0
        _check(libc.umount2(args[0].encode(), flags), f"umount {args[0]}")
    else:
        raise ValueError(f"unknown operation {op!r}")


def main(argv: Sequence[str]) -> int:
    try:
        run(argv)
    except (OSError, ValueError, IndexError) as exc:
        print(f"nsops {' '.join(argv)[:200]}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
