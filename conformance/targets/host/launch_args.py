"""The launcher's arguments: the device nodes it makes and the options that name them.

Standard library only and free of package imports, like the launcher, which loads this sibling
by path when it runs as a file (`python -I launcher.py`).
"""

from __future__ import annotations

import argparse
import stat
from dataclasses import dataclass

# Character devices every container /dev has; numbers are fixed by the kernel ABI.
BASE_DEVICES: dict[str, tuple[int, int]] = {
    "null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9),
    "tty": (5, 0),
}  # fmt: skip
DEFAULT_BASE = ("null", "zero", "random", "urandom", "tty")
NODE_TYPES = {"c": stat.S_IFCHR, "u": stat.S_IFCHR, "b": stat.S_IFBLK, "p": stat.S_IFIFO}


@dataclass(frozen=True)
class NodeSpec:
    """A device node to create in the private /dev (a runtime's CDI deviceNode edit)."""

    path: str
    kind: str
    major: int
    minor: int
    mode: int
    uid: int
    gid: int

    def to_arg(self) -> str:
        """The --mknod argument: PATH:TYPE:MAJOR:MINOR:MODE(octal):UID:GID."""
        fields = (self.kind, self.major, self.minor, f"{self.mode:o}", self.uid, self.gid)
        return ":".join([self.path, *map(str, fields)])

    @classmethod
    def from_arg(cls, text: str) -> NodeSpec:
        """Parse a --mknod argument; split from the right so a path may contain ':'."""
        parts = text.rsplit(":", 6)
        if len(parts) != 7 or parts[1] not in NODE_TYPES:
            raise ValueError(f"--mknod {text!r}: want PATH:TYPE(c|b|u|p):MAJOR:MINOR:MODE:UID:GID")
        path, kind, major, minor, mode, uid, gid = parts
        return cls(path, kind, int(major), int(minor), int(mode, 8), int(uid), int(gid))


def _user(text: str) -> tuple[int, int]:
    uid, sep, gid = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"want UID:GID, got {text!r}")
    return int(uid), int(gid)


def _base(text: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    unknown = sorted(set(names) - set(BASE_DEVICES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown base device(s) {', '.join(unknown)}")
    return names


def _mknod_arg(text: str) -> NodeSpec:
    try:
        return NodeSpec.from_arg(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _bind_arg(text: str) -> tuple[str, str]:
    source, sep, target = text.rpartition(":")
    if not sep or not source.startswith("/") or not target.startswith("/"):
        raise argparse.ArgumentTypeError(f"want SRC:DST (absolute paths), got {text!r}")
    return source, target


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """Options of the launcher; ARGV follows `--`."""
    p = argparse.ArgumentParser(
        prog="python -m hvconform.targets.host.launcher",
        description=description,
    )
    net = p.add_mutually_exclusive_group()
    net.add_argument("--netns", metavar="NAME", help="join /run/netns/NAME")
    net.add_argument("--unshare-net", action="store_true", help="fresh netns, only lo (up)")
    p.add_argument("--private-dev", action="store_true", help="fresh tmpfs on /dev")
    # fmt: off
    p.add_argument("--base-devs", type=_base, default=list(DEFAULT_BASE), metavar="A,B",
                   help=f"base nodes of the private /dev (default {','.join(DEFAULT_BASE)})")
    p.add_argument("--dev-node", action="append", default=[], metavar="PATH",
                   help="bind-mount the host's node at PATH (missing: skipped with a message)")
    p.add_argument("--mknod", action="append", default=[], type=_mknod_arg,
                   metavar="PATH:TYPE:MAJOR:MINOR:MODE:UID:GID", help="create a node")
    p.add_argument("--dev-cover", action="append", default=[], type=_bind_arg,
                   metavar="SRC:PATH", help="bind host node SRC over PATH, last")
    # fmt: on
    p.add_argument(
        "--bind",
        action="append",
        default=[],
        type=_bind_arg,
        metavar="SRC:DST",
        help="bind host dir SRC at DST in the namespace (never creating DST on the host)",
    )
    p.add_argument(
        "--stage-root",
        metavar="DIR",
        help="shadow / onto DIR and chroot there (binds that need a new top-level dir)",
    )
    p.add_argument("--user", type=_user, metavar="UID:GID", help="switch uid/gid, no groups")
    p.add_argument("--drop-caps", action="store_true", help="drop every capability set")
    p.add_argument("--no-new-privs", action="store_true", help="set no_new_privs")
    p.add_argument("--exec-fd", type=int, metavar="N", help="report errors on fd N; EOF = exec")
    p.add_argument("argv", nargs="+", metavar="ARGV")
    return p
