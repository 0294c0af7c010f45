"""Atomic, symlink-safe reconciliation of the one CDI spec file the plugin owns.

Every filesystem operation is relative to a descriptor of the CDI directory opened with
O_NOFOLLOW, so neither the directory's last component nor the spec path is ever followed
through a symlink. Nothing but the spec file (and our own temporary file) is ever touched.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hv_device_plugin.cdi_spec import (
    DEFAULT_CDI_VERSION,
    DEFAULT_KIND,
    KNOWN_VERSIONS,
    desired_spec,
    qualified_name,
    required_version,
    validate_spec,
)
from hv_device_plugin.device import a_file_type
from hv_device_plugin.inputs import printable

__all__ = [
    "DEFAULT_CDI_VERSION",
    "DEFAULT_KIND",
    "KNOWN_VERSIONS",
    "CdiReconciler",
    "CdiState",
    "CdiStatus",
    "desired_spec",
    "qualified_name",
    "required_version",
    "validate_spec",
]

CdiState = Literal["desired", "missing", "malformed", "stale", "wrong_mode", "obstructed", "error"]
_REPAIRABLE: frozenset[CdiState] = frozenset({"missing", "malformed", "stale", "wrong_mode"})
# A spec file is tiny; refuse to slurp an arbitrarily large file someone put there.
MAX_SPEC_BYTES = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Per-target locks, so two reconcilers of the same file in one process also serialise.
_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


@dataclass(frozen=True)
class CdiStatus:
    """Outcome of one inspection or reconciliation."""

    state: CdiState
    repaired: bool = False
    # The defect found (missing/malformed/stale/wrong_mode) when a rewrite was made or tried.
    cause: str | None = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.state == "desired"


class _Failure(Exception):
    """An OS error turned into a one-line, deterministic reason."""

    def __init__(self, op: str, exc: OSError) -> None:
        name = errno.errorcode.get(exc.errno or 0, f"errno {exc.errno}")
        super().__init__(f"{op}: {name} ({exc.strerror})")
        self.errno = exc.errno


# statfs(2) f_type of the filesystems kept in memory: TMPFS_MAGIC, RAMFS_MAGIC.
MEMORY_FILESYSTEMS = frozenset({0x01021994, 0x858458F6})
# struct statfs is 120 bytes on 64-bit Linux and 84 on 32-bit; f_type comes first, a C long.
_STATFS_BYTES = 256
_libc = ctypes.CDLL(None, use_errno=True)


def _fs_type(path: Path) -> int:
    """statfs(2) f_type of the filesystem holding `path`, 0 when it cannot be read."""
    buf = ctypes.create_string_buffer(_STATFS_BYTES)
    if _libc.statfs(os.fsencode(path), buf) != 0:
        return 0
    width = ctypes.sizeof(ctypes.c_long)
    return int.from_bytes(buf.raw[:width], sys.byteorder) & 0xFFFFFFFF


def forget_lock(cdi_dir: Path, filename: str) -> None:
    """Drop the lock of a spec no longer kept (a DRA claim's, once unprepared): a driver that
    prepares claims for months must not keep one lock per claim it ever saw."""
    with _LOCKS_GUARD:
        _LOCKS.pop((str(Path(cdi_dir).absolute()), filename), None)


class CdiReconciler:
    """Keeps `cdi_dir/filename` byte-identical to `desired` with exactly `mode`."""

    def __init__(self, cdi_dir: Path, filename: str, desired: bytes, mode: int = 0o644) -> None:
        if not filename or "/" in filename or "\0" in filename or filename in (".", ".."):
            raise ValueError(f"filename must be a plain file name, got {filename!r}")
        if not filename.endswith((".json", ".yaml")):
            raise ValueError(f"filename {filename!r} must end in .json or .yaml to be read")
        if not 0 <= mode <= 0o7777:
            raise ValueError(f"mode must be a permission mode, got {mode:o}")
        problems = validate_spec(desired)
        if problems:
            raise ValueError("desired CDI spec is invalid: " + "; ".join(problems))
        self.cdi_dir = Path(cdi_dir)
        self.filename = filename
        self.desired = bytes(desired)
        self.mode = mode
        self.path = self.cdi_dir / filename
        key = (str(self.cdi_dir.absolute()), filename)
        with _LOCKS_GUARD:
            self._lock = _LOCKS.setdefault(key, threading.Lock())

    def watches(self, name: str) -> bool:
        """A CDI-dir event on `name` may have changed this spec."""
        return name == self.filename

    def label(self) -> str:
        return str(self.path)

    def inspect(self) -> CdiStatus:
        """Classify the spec path without changing anything."""
        with self._lock:
            return self._guarded(repair=False)

    def memory_backed(self) -> bool:
        """The CDI dir is on tmpfs or ramfs (a node's /run/cdi usually is): a repair there is a
        memory copy and its fsyncs are no-ops, so it cannot stall the thread that does it."""
        return _fs_type(self.cdi_dir) in MEMORY_FILESYSTEMS

    def reconcile(self) -> CdiStatus:
        """Classify, and rewrite atomically when missing, malformed, stale or of the wrong mode."""
        with self._lock:
            return self._guarded(repair=True)

    def _guarded(self, *, repair: bool) -> CdiStatus:
        # Callers run this from a thread pool: an OS error becomes a status, never an exception.
        try:
            return self._run(repair=repair)
        except OSError as exc:
            return CdiStatus("error", reason=str(_Failure(f"reconcile {self.path}", exc)))

    def _run(self, *, repair: bool) -> CdiStatus:
        try:
            dir_fd = os.open(self.cdi_dir, _DIR_FLAGS)
        except OSError as exc:
            return CdiStatus("error", reason=self._dir_reason(exc))
        try:
            found = self._classify(dir_fd)
            if not repair or found.state not in _REPAIRABLE:
                return found
            try:
                self._rewrite(dir_fd)
            except _Failure as exc:
                return CdiStatus(
                    "error",
                    cause=found.state,
                    reason=f"{found.state}; repair failed: {exc}",
                )
            after = self._classify(dir_fd)
            if after.ok:
                return CdiStatus("desired", repaired=True, cause=found.state)
            return CdiStatus(
                after.state,
                cause=found.state,
                reason=f"changed again right after repair: {after.reason}",
            )
        finally:
            os.close(dir_fd)

    def _dir_reason(self, exc: OSError) -> str:
        name = errno.errorcode.get(exc.errno or 0, f"errno {exc.errno}")
        if exc.errno == errno.ENOENT:
            return f"CDI directory {self.cdi_dir} does not exist (open: ENOENT)"
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            # O_NOFOLLOW|O_DIRECTORY on a symlink fails with either; say which it was.
            try:
                what = a_file_type(os.lstat(self.cdi_dir).st_mode)
            except OSError:
                what = "not a directory"
            if what == "a symlink":
                what += "; refusing to follow"
            return f"CDI directory {self.cdi_dir} is {what} (open: {name})"
        return f"open CDI directory {self.cdi_dir}: {name} ({exc.strerror})"

    def _obstructed(self, mode: int) -> CdiStatus:
        kind = a_file_type(mode)
        return CdiStatus(
            "obstructed", reason=f"{self.path} is {kind}, not a regular file; left untouched"
        )

    def _classify(self, dir_fd: int) -> CdiStatus:
        try:
            st = os.stat(self.filename, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return CdiStatus("missing", reason=f"{self.path} does not exist")
        except OSError as exc:
            return CdiStatus("error", reason=str(_Failure(f"lstat {self.path}", exc)))
        if not stat.S_ISREG(st.st_mode):
            return self._obstructed(st.st_mode)
        try:
            data, st = self._read(dir_fd)
        except _Failure as exc:
            if exc.errno == errno.ELOOP:  # became a symlink since the lstat
                return self._obstructed(stat.S_IFLNK)
            if exc.errno == errno.ENOENT:
                return CdiStatus("missing", reason=f"{self.path} does not exist")
            return CdiStatus("error", reason=str(exc))
        if not stat.S_ISREG(st.st_mode):
            return self._obstructed(st.st_mode)
        if data != self.desired:
            problems = (
                [f"larger than {MAX_SPEC_BYTES} bytes"] if data is None else validate_spec(data)
            )
            if problems:
                # A problem may quote the file (a key, a value): cut to one bounded line.
                return CdiStatus("malformed", reason=f"{self.path}: {printable(problems[0])}")
            return CdiStatus("stale", reason=f"{self.path} differs from the desired content")
        mode = stat.S_IMODE(st.st_mode)
        if mode != self.mode:
            return CdiStatus(
                "wrong_mode", reason=f"{self.path} has mode {mode:04o}, want {self.mode:04o}"
            )
        return CdiStatus("desired")

    def _read(self, dir_fd: int) -> tuple[bytes | None, os.stat_result]:
        """Content (None when too large) and fstat of the spec file, opened without following."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
        try:
            fd = os.open(self.filename, flags, dir_fd=dir_fd)
        except OSError as exc:
            raise _Failure(f"open {self.path}", exc) from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return b"", st
            chunks: list[bytes] = []
            total = 0
            while total <= MAX_SPEC_BYTES:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return b"".join(chunks), st
                chunks.append(chunk)
                total += len(chunk)
            return None, st
        except OSError as exc:
            raise _Failure(f"read {self.path}", exc) from exc
        finally:
            os.close(fd)

    def _rewrite(self, dir_fd: int) -> None:
        """Write a temp file beside the target (no .json/.yaml suffix), fsync, rename, fsync dir."""
        tmp = f".{self.filename}.tmp-{os.getpid()}-{secrets.token_hex(6)}"
        # The random suffix stays out of reasons so a repeated failure reads the same.
        where = f"temp file in {self.cdi_dir}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, self.mode, dir_fd=dir_fd)
        except OSError as exc:
            raise _Failure(f"create {where}", exc) from exc
        renamed = False
        try:
            try:
                os.fchmod(fd, self.mode)  # the umask may have narrowed the create mode
                view = memoryview(self.desired)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError as exc:
                raise _Failure(f"write {where}", exc) from exc
            finally:
                os.close(fd)
            try:
                os.rename(tmp, self.filename, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except OSError as exc:
                raise _Failure(f"rename temp file onto {self.path}", exc) from exc
            renamed = True
            try:
                os.fsync(dir_fd)
            except OSError as exc:
                raise _Failure(f"fsync {self.cdi_dir}", exc) from exc
        finally:
            if not renamed:
                # Nothing better to do if even the cleanup fails; the original error wins.
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dir_fd)
