"""Enter namespaces, build a private /dev, drop privileges, then exec a plugin or a workload.

Usage: `python -m hvconform.targets.host.launcher [options] -- ARGV...`. Standard library only and
free of package imports, so the harness can also run it by file path (`python -I launcher.py`)
with nothing on sys.path. Steps, in order: join `/run/netns/NAME` (--netns) or a fresh empty
network namespace with lo up (--unshare-net); a private mount namespace with `/` recursively
private; with --private-dev a fresh tmpfs on /dev holding the base nodes, the host nodes named by
--dev-node (bind-mounted, as a runtime injects devices) and the --mknod nodes; --user; capability
drop and no_new_privs; verification from /proc/self/status; exec.

Exit status when ARGV never ran: 125 setup failed, 126 privileges not verified or ARGV not
executable, 127 ARGV not found. With --exec-fd N the same "CODE:message" is also written to fd N,
which is close-on-exec: the parent reads EOF without data exactly when ARGV was exec'ed.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import stat
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    from hvconform.targets.host import binds, launch_args
except ImportError:  # run by file path (python -I launcher.py): load the siblings by path
    import importlib.util

    def _sibling(name: str) -> Any:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while defining
        spec.loader.exec_module(module)
        return module

    binds = _sibling("binds")
    launch_args = _sibling("launch_args")

NodeSpec = launch_args.NodeSpec
BASE_DEVICES = launch_args.BASE_DEVICES
build_parser = launch_args.build_parser

EXIT_SETUP, EXIT_PRIVILEGES, EXIT_NOT_FOUND = 125, 126, 127
LAUNCHER = Path(__file__).resolve()

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_NOSUID = 0x2
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_SLAVE = 0x80000
MNT_DETACH = 0x2
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_VERSION_3 = 0x20080522
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

CAP_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


class LaunchError(Exception):
    """A step failed before exec; `code` is the exit status to report."""

    def __init__(self, message: str, code: int = EXIT_SETUP) -> None:
        super().__init__(message)
        self.code = code


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_char_p,
    ]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    libc.prctl.argtypes = [ctypes.c_int, *([ctypes.c_ulong] * 4)]
    return libc


def _check(ret: int, what: str, code: int = EXIT_SETUP) -> int:
    if ret < 0:
        raise LaunchError(f"{what}: {os.strerror(ctypes.get_errno())}", code)
    return ret


def _mount(
    libc: ctypes.CDLL,
    src: str | None,
    dst: str,
    fstype: str | None,
    flags: int,
    data: str | None = None,
) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    ret = libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data))
    _check(ret, f"mount {src or fstype} on {dst}")


def enter_netns(libc: ctypes.CDLL, name: str) -> None:
    """Join a named network namespace (a path is accepted too)."""
    path = name if "/" in name else f"/run/netns/{name}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise LaunchError(f"network namespace {path}: {exc.strerror}") from exc
    try:
        _check(libc.setns(fd, CLONE_NEWNET), f"setns {path}")
    finally:
        os.close(fd)


def new_empty_netns(libc: ctypes.CDLL) -> None:
    """`--network none`: a fresh network namespace with only loopback, brought up."""
    _check(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def private_mounts(libc: ctypes.CDLL) -> None:
    """A slave mount namespace: nothing done here propagates back to the host.

    Slave rather than private: mounts the host makes later under a shared subtree (a node's
    CDI dir made read-only, say) reach the sandbox, as a hostPath with HostToContainer does.
    """
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(libc, None, "/", None, MS_REC | MS_SLAVE)
    # The copied /run/netns mounts would pin every other sandbox's network namespace for as
    # long as this process lives; a container never sees them either.
    # (os.path.ismount misses /run/netns: it is a directory bind-mounted onto itself.)
    for _ in range(8):
        if "/run/netns" not in _mount_points("/run/netns"):
            break
        _check(libc.umount2(b"/run/netns", MNT_DETACH), "umount /run/netns")


def _make_parents(path: str) -> None:
    parent = Path(path).parent
    if parent != Path("/dev"):
        parent.mkdir(mode=0o755, parents=True, exist_ok=True)


def _dev_path(path: str) -> str:
    norm = os.path.normpath(path)
    if not norm.startswith("/dev/") or norm != path:
        # Creating nodes outside the private tmpfs would modify the host's filesystem.
        raise LaunchError(f"device path {path!r} must be a normalised path under /dev")
    return norm


def make_node(spec: NodeSpec) -> None:
    """mknod with explicit owner and mode (mknod alone honours the umask)."""
    path = _dev_path(spec.path)
    _make_parents(path)
    node = Path(path)
    node.unlink(missing_ok=True)  # a spec'd node replaces a base node of the same path
    try:
        os.mknod(
            node, launch_args.NODE_TYPES[spec.kind] | 0o600, os.makedev(spec.major, spec.minor)
        )
        os.chown(node, spec.uid, spec.gid)
        node.chmod(spec.mode & 0o7777)
    except OSError as exc:
        raise LaunchError(f"mknod {path} ({spec.to_arg()}): {exc.strerror}") from exc


def _mount_points(prefix: str) -> set[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        points = {line.split()[4].replace("\\040", " ") for line in fh}
    return {p for p in points if p.startswith(prefix)}


def private_dev(
    libc: ctypes.CDLL,
    base: Sequence[str],
    dev_nodes: Sequence[str],
    nodes: Sequence[NodeSpec],
    covers: Sequence[tuple[str, str]] = (),
) -> None:
    """A fresh tmpfs on /dev with only the base nodes, the injected host nodes and `nodes`;
    then each cover's host node bound over its path (a device that is there but not yet usable,
    as after a reboot: undone by unmounting it, which reveals the injected node)."""
    held: list[tuple[str, int]] = []
    covering: list[tuple[str, int]] = []
    for source, path in covers:
        fd = os.open(source, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        if not stat.S_ISCHR(os.fstat(fd).st_mode):
            os.close(fd)
            raise LaunchError(f"--dev-cover {source}: not a character device")
        covering.append((_dev_path(path), fd))
    for path in dev_nodes:
        target = _dev_path(path)
        # O_PATH keeps a handle on the host node after the tmpfs hides the host's /dev.
        try:
            fd = os.open(target, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            print(
                f"launcher: --dev-node {target}: no such node on the host, skipped", file=sys.stderr
            )
            continue
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)):
            os.close(fd)
            raise LaunchError(f"--dev-node {target}: not a device node on the host")
        held.append((target, fd))
    # Host submounts (pts, shm, mqueue) would only be shadowed; detach them, deepest first.
    # Mounts may be stacked on one path (this host has two /dev/pts), hence the rounds.
    for _ in range(64):
        points = sorted(_mount_points("/dev/"), reverse=True)
        if not points:
            break
        for point in points:
            _check(libc.umount2(point.encode(), MNT_DETACH), f"umount {point}")
    _mount(libc, "tmpfs", "/dev", "tmpfs", MS_NOSUID, "mode=0755,size=65536k")
    for name in base:
        major, minor = BASE_DEVICES[name]
        make_node(NodeSpec(f"/dev/{name}", "c", major, minor, 0o666, 0, 0))
    for target, fd in held:
        _make_parents(target)
        os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0))
        _mount(libc, f"/proc/self/fd/{fd}", target, None, MS_BIND)
        os.close(fd)
    for spec in nodes:
        make_node(spec)
    for target, fd in covering:
        if not os.path.lexists(target):
            _make_parents(target)
            os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0))
        _mount(libc, f"/proc/self/fd/{fd}", target, None, MS_BIND)
        os.close(fd)


def drop_privileges(
    libc: ctypes.CDLL, *, drop_caps: bool, no_new_privs: bool, user: tuple[int, int] | None
) -> None:
    """no_new_privs, empty ambient and bounding sets, optional uid/gid switch, capset zero."""
    if no_new_privs:
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    if drop_caps:
        _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient")
        with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as fh:
            last = int(fh.read())
        # The bounding set goes while CAP_SETPCAP is still held; an empty bounding set is what
        # keeps uid 0 from regaining every capability at execve.
        for cap in range(last + 1):
            if _check(libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0), f"read bounding cap {cap}"):
                _check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop bounding cap {cap}")
    if user is not None:
        uid, gid = user
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        except OSError as exc:
            raise LaunchError(f"switch to uid {uid} gid {gid}: {exc.strerror}") from exc
    if drop_caps:
        header = struct.pack("=Ii", _CAP_VERSION_3, 0)
        data = bytes(24)  # two {effective, permitted, inheritable} u32 triples, all zero
        hbuf, dbuf = ctypes.create_string_buffer(header), ctypes.create_string_buffer(data)
        _check(libc.capset(hbuf, dbuf), "capset(all zero)", EXIT_PRIVILEGES)


def read_status(pid: int | str = "self") -> dict[str, str]:
    """/proc/<pid>/status as field -> whitespace-normalised value."""
    fields: dict[str, str] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            fields[key] = " ".join(value.split())
    return fields


def verify(*, drop_caps: bool, no_new_privs: bool, user: tuple[int, int] | None) -> None:
    """Check the result in /proc/self/status, the kernel's view, not our bookkeeping."""
    status = read_status()
    problems: list[str] = []
    if drop_caps:
        problems += [f"{k}={status.get(k)}" for k in CAP_FIELDS if int(status.get(k, "1"), 16)]
    if no_new_privs and status.get("NoNewPrivs") != "1":
        problems.append(f"NoNewPrivs={status.get('NoNewPrivs')}")
    if user is not None:
        for key, want in (("Uid", user[0]), ("Gid", user[1])):
            if status.get(key) != " ".join([str(want)] * 4):
                problems.append(f"{key}={status.get(key)!r}")
        if status.get("Groups"):
            problems.append(f"Groups={status.get('Groups')!r}")
    if problems:
        raise LaunchError("privileges not dropped: " + ", ".join(problems), EXIT_PRIVILEGES)


def _fail(exec_fd: int | None, code: int, message: str) -> int:
    print(f"launcher: {message}", file=sys.stderr, flush=True)
    if exec_fd is not None:
        os.write(exec_fd, f"{code}:{message}".encode())
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run every requested step, then exec; returns an exit status only on failure."""
    args = build_parser(__doc__.split("\n\n")[0] if __doc__ else None).parse_args(argv)
    # The environment as given at exec, not os.environ: Python's locale coercion adds LC_CTYPE
    # to its own, which must not leak. Read now: after a uid switch the process is not dumpable
    # and /proc/self/environ is no longer readable.
    raw = Path("/proc/self/environ").read_bytes().split(b"\0")
    env = dict(item.split(b"=", 1) for item in raw if b"=" in item)
    if (args.dev_node or args.mknod or args.dev_cover) and not args.private_dev:
        return _fail(args.exec_fd, EXIT_SETUP, "--dev-node/--mknod/--dev-cover need --private-dev")
    try:
        if args.exec_fd is not None:
            os.set_inheritable(args.exec_fd, False)  # closes at exec: the parent sees EOF
        libc = _libc()
        if args.netns:
            enter_netns(libc, args.netns)
        elif args.unshare_net:
            new_empty_netns(libc)
        private_mounts(libc)
        if args.private_dev:
            private_dev(libc, args.base_devs, args.dev_node, args.mknod, args.dev_cover)
        if args.bind or args.stage_root:
            root = binds.apply(
                lambda src, dst, fs, fl, data: _mount(libc, src, dst, fs, fl, data),
                args.bind,
                args.stage_root,
            )
            binds.enter_root(libc, root)
        drop_privileges(
            libc, drop_caps=args.drop_caps, no_new_privs=args.no_new_privs, user=args.user
        )
        verify(drop_caps=args.drop_caps, no_new_privs=args.no_new_privs, user=args.user)
    except LaunchError as exc:
        return _fail(args.exec_fd, exc.code, str(exc))
    except binds.BindError as exc:
        return _fail(args.exec_fd, EXIT_SETUP, str(exc))
    except OSError as exc:
        return _fail(args.exec_fd, EXIT_SETUP, f"setup: {exc}")
    try:
        os.execvpe(args.argv[0], args.argv, env)  # noqa: S606 - exec'ing ARGV is the job
    except OSError as exc:
        code = EXIT_NOT_FOUND if exc.errno == errno.ENOENT else EXIT_PRIVILEGES
        return _fail(args.exec_fd, code, f"exec {args.argv[0]}: {exc.strerror}")
    return EXIT_SETUP  # not reached: execvp returns only by raising


if __name__ == "__main__":
    sys.exit(main())
