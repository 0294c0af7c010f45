"""Bind node directories at the paths a plugin expects, inside its own mount namespace only.

A DaemonSet gives a plugin its directories as hostPath volumes at fixed paths
(/var/lib/kubelet/device-plugins, /var/run/cdi, ...). The local node reproduces that in the
plugin's mount namespace. A mount point that does not exist must never be created on the host's
filesystem, so the nearest existing ancestor is *shadowed*: covered, in this namespace only, by a
tmpfs that holds a bind mount of every entry it had, after which the missing directories are made
in the tmpfs. A missing top-level directory (its ancestor is "/") cannot be shadowed in place (a
process does not see mounts stacked on its own root), so the whole root is shadowed onto a
staging directory and the process chroots into it; the harness then addresses the namespace's
paths under that prefix (`ns_path`). Standard library only: the launcher imports it.
"""

from __future__ import annotations

import ctypes
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

MS_BIND = 0x1000
MS_REC = 0x4000
MS_NOSUID = 0x2

Mount = Callable[[str | None, str, str | None, int, str | None], None]


class BindError(Exception):
    """A bind could not be made; the message names the path."""


def nearest_existing(path: str, root: str = "/") -> str:
    """The deepest existing ancestor (or path itself) of `path`, as seen under `root`."""
    current = PurePosixPath(path)
    while str(current) != "/" and not os.path.lexists(ns_path(root, str(current))):
        current = current.parent
    return str(current)


def needs_new_root(targets: Sequence[str]) -> bool:
    """True when a target is (or needs) a top-level directory: only a staged root can give it
    a mount point of the namespace's own."""
    return any(str(PurePosixPath(resolve(t)).parent) == "/" for t in targets)


def ns_path(root: str, path: str) -> str:
    """Where `path` of a (possibly staged) root is, in the namespace's own coordinates."""
    return path if root == "/" else root.rstrip("/") + path


def resolve(path: str, root: str = "/", depth: int = 0) -> str:
    """`path` with every symlink of its existing components resolved relative to `root`."""
    if depth > 16:
        raise BindError(f"{path}: too many levels of symbolic links")
    done = PurePosixPath("/")
    parts = PurePosixPath(path).parts[1:]
    for i, part in enumerate(parts):
        candidate = done / part
        real = ns_path(root, str(candidate))
        if Path(real).is_symlink():
            link = PurePosixPath(Path(real).readlink())
            base = link if link.is_absolute() else done / link
            rest = PurePosixPath(*parts[i + 1 :]) if i + 1 < len(parts) else None
            joined = os.path.normpath(str(base / rest) if rest else str(base))
            return resolve(joined, root, depth + 1)
        done = candidate
    return str(done)


def _placeholder(entry: str, mode: int) -> None:
    if stat.S_ISDIR(mode):
        Path(entry).mkdir(0o755)
    else:
        os.close(os.open(entry, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644))


def shadow(mount: Mount, source: str, at: str, skip: str = "") -> None:
    """Cover `at` with a tmpfs holding bind mounts of every entry of `source`.

    An O_PATH handle on `source` is taken first: once the tmpfs covers it, its entries are only
    reachable through that handle. Symlinks are copied as symlinks (never followed).
    """
    fd = os.open(source, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        handle = f"/proc/self/fd/{fd}"
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        names = sorted(p.name for p in Path(handle).iterdir())
        mount("tmpfs", at, "tmpfs", MS_NOSUID, f"mode={mode:o},size=1m")
        for name in names:
            entry, original = str(Path(at) / name), f"{handle}/{name}"
            st = os.lstat(original)
            if stat.S_ISLNK(st.st_mode):
                Path(entry).symlink_to(Path(original).readlink())
                continue
            _placeholder(entry, st.st_mode)
            if name != skip:
                mount(original, entry, None, MS_BIND | MS_REC, None)
    finally:
        os.close(fd)


def make_dirs(path: str) -> None:
    """mkdir -p inside a shadow (the caller made sure the first missing level is on tmpfs)."""
    Path(path).mkdir(mode=0o755, parents=True, exist_ok=True)


# How deep the host's own directories go: below an FHS top-level directory's children
# (/var/lib, /run/x), a directory may be made and removed by anyone (a node stack's kubelet root
# under /var/lib), and a tmpfs on its dentry would be detached from this namespace when it goes.
STABLE_DEPTH = 2


def _stable_anchor(anchor: str, skip: str, made: Sequence[str]) -> tuple[str, str]:
    """Move a shadow up to the host's own level when it would sit on a host dentry deeper
    than STABLE_DEPTH (unless it lies in a tmpfs made here); `skip` names the entry towards the
    target, which the shadow leaves out (an empty placeholder: the path is made in the tmpfs)."""
    parts = PurePosixPath(anchor).parts  # ("/", "var", "lib", "kubelet")
    ours = any(anchor == m or anchor.startswith(m.rstrip("/") + "/") for m in made)
    if ours or len(parts) <= STABLE_DEPTH + 1:
        return anchor, skip
    return str(PurePosixPath(*parts[: STABLE_DEPTH + 1])), parts[STABLE_DEPTH + 1]


def apply(mount: Mount, binds: Sequence[tuple[str, str]], stage: str | None) -> str:
    """Make every (host source, namespace target) bind; return the root to chroot into ("/")."""
    root = "/"
    if stage is not None:
        shadow(mount, "/", stage, skip=PurePosixPath(stage).parts[1])
        root = stage
    # Host sources are opened before any shadow can hide them.
    handles: list[tuple[int, str]] = []
    made: list[str] = []  # anchors shadowed here: their tmpfs is this namespace's own
    try:
        for source, target in binds:
            fd = os.open(source, os.O_PATH | os.O_CLOEXEC)
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                os.close(fd)
                raise BindError(f"--bind {source}: not a directory")
            handles.append((fd, target))
        for fd, target in handles:
            real = resolve(target, root)
            if real == "/dev" or real.startswith("/dev/"):
                raise BindError(f"--bind target {target}: under /dev, which the runtime owns")
            # The mount point is always made in a tmpfs of the namespace's own, even when the
            # host has the directory: a bind on a host dentry is detached when the host removes
            # it, and the plugin would then write into the host's real directory.
            anchor = nearest_existing(real, root)
            skip = ""
            if anchor == real:
                anchor, skip = str(PurePosixPath(real).parent), PurePosixPath(real).name
            anchor, skip = _stable_anchor(anchor, skip, made)
            if anchor == "/" and root == "/":
                raise BindError(f"--bind target {target}: a top-level directory needs a stage")
            if anchor != "/":
                shadow(mount, ns_path(root, anchor), ns_path(root, anchor), skip=skip)
                made.append(anchor)
            make_dirs(ns_path(root, real))
            mount(f"/proc/self/fd/{fd}", ns_path(root, real), None, MS_BIND | MS_REC, None)
    finally:
        for fd, _ in handles:
            os.close(fd)
    return root


def enter_root(libc: ctypes.CDLL, root: str) -> None:
    """chroot into a staged root (the namespace is private: nothing else sees it)."""
    if root == "/":
        return
    os.chroot(root)
    os.chdir("/")
