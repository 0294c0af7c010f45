"""The evidence bundle: the files the run wrote, in one deterministic tar.gz.

Which files: those the run's manifest lists (hvconform.contract.manifest); for results without
a manifest (pytest run alone, an older run) the suite's fixed layout (LAYOUT). Nothing else in the
directory is taken, hidden names never. Each file is opened component by component with
O_NOFOLLOW, so neither a symlinked file nor a symlinked directory can pull in a host file.

Bounded: files are streamed in chunks, never read whole, and a file over MAX_FILE_BYTES is left
out; so is a file whose name looks like a credential (CREDENTIALS: a kubeconfig the cluster targets
keep, a key). What was left out, and why, is returned so the report can name it.

Same files, same bytes: members sorted, owner, mode and times fixed, gzip header without a name
or a clock. SHA256SUMS comes first so a reader can check any file without unpacking all.
"""

from __future__ import annotations

import calendar
import fnmatch
import gzip
import hashlib
import io
import os
import re
import stat
import tarfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hvconform.contract import manifest
from hvconform.contract.safewrite import atomic_file

SUMS = "SHA256SUMS"
MAX_FILE_BYTES = 64 * 1024 * 1024  # per file: a plugin log of a long run is a few MiB
CHUNK = 256 * 1024
# What a run writes when no manifest lists it (see hvconform.suite.pytest_plugin and targets).
LAYOUT = (
    "results.json", "pytest-junit.xml", "plugin-*.log", "cluster-*.json", "cluster/commands.log",
    "evidence/*", "ledger/*.jsonl", "metadata/*.json", "targets/*.json", "plugin-ran/*.json",
)  # fmt: skip
CREDENTIALS = (
    "kubeconfig*", "*.key", "*.pem", "*.p12", "*.pfx", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
)  # fmt: skip
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Member:
    name: str  # member name under the bundle's prefix
    source: str  # relative to the run dir, or an absolute path the renderer wrote
    size: int


@dataclass
class Selection:
    """What goes into the bundle, what was left out (name, why) and where the list came from."""

    members: list[Member] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)
    source: str = "manifest"

    @property
    def notes(self) -> list[str]:
        """Sentences for the report: where the list came from, then every file left out."""
        head = (
            "evidence.tar.gz holds the files the run's manifest lists"
            if self.source == "manifest"
            else "No manifest: evidence.tar.gz holds the suite's fixed layout only"
        )
        return [head] + [f"Left out: {name}: {why}" for name, why in self.left_out]


def _open_in(run_dir: Path, rel: str) -> int:
    """A read fd for run_dir/rel; OSError when any component is a symlink or not a directory."""
    parts = rel.split("/")
    fd = os.open(run_dir, _FLAGS | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            child = os.open(part, _FLAGS | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        return os.open(parts[-1], _FLAGS | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)


def _via_symlink(run_dir: Path, rel: str) -> bool:
    """Whether rel, or a directory on its way, is a symlink (why _open_in refused it)."""
    path = run_dir
    for part in rel.split("/"):
        path = path / part
        if path.is_symlink():
            return True
    return False


def _size_of(fd: int) -> int | None:
    st = os.fstat(fd)
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _mib(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MiB"


def _layout(run_dir: Path) -> list[str]:
    """Names in run_dir that match LAYOUT, listed without following any symlink."""
    found = [e.name for e in os.scandir(run_dir)]
    for top in sorted({p.split("/")[0] for p in LAYOUT if "/" in p}):
        where = run_dir / top
        if where.is_dir() and not where.is_symlink():
            found += [f"{top}/{e.name}" for e in os.scandir(where)]
    return sorted(n for n in found if any(fnmatch.fnmatchcase(n, p) for p in LAYOUT))


def select(run_dir: Path, exclude: frozenset[str] = frozenset()) -> Selection:
    """The members from run_dir (ManifestError when its manifest is broken)."""
    listed = manifest.read(run_dir)
    chosen = Selection(source="manifest" if listed is not None else "layout")
    for rel in listed if listed is not None else _layout(run_dir):
        if rel in exclude or rel.endswith(".tmp"):
            continue
        why = manifest.safe_name(rel)
        base = rel.rsplit("/", 1)[-1]
        if why is None and any(fnmatch.fnmatchcase(base, p) for p in CREDENTIALS):
            why = "a credential by its name; never bundled"
        size = None
        if why is None:
            try:
                fd = _open_in(run_dir, rel)
            except OSError as exc:
                why = "a symlink, not followed" if _via_symlink(run_dir, rel) else exc.strerror
            else:
                size = _size_of(fd)
                os.close(fd)
                why = None if size is not None else "not a regular file"
        if why is None and size is not None and size > MAX_FILE_BYTES:
            why = f"{_mib(size)}, larger than the {_mib(MAX_FILE_BYTES)} cap per file"
        if why is not None or size is None:
            chosen.left_out.append((rel, why or "unreadable"))
        else:
            chosen.members.append(Member(rel, rel, size))
    return chosen


def _chunks(fd: int, size: int) -> Iterator[bytes]:
    """Exactly size bytes: a file that shrank since it was sized is padded with NULs."""
    left = size
    while left:
        data = os.read(fd, min(CHUNK, left)) or b"\0" * min(CHUNK, left)
        left -= len(data)
        yield data


class _Stream(io.RawIOBase):
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._rest = chunks, b""

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        while not self._rest:
            self._rest = next(self._chunks, b"")
            if not self._rest:
                return b""
        data, self._rest = self._rest[:n], self._rest[n:]
        return data


def _open_member(run_dir: Path, member: Member) -> int:
    if Path(member.source).is_absolute():
        return os.open(member.source, _FLAGS)
    return _open_in(run_dir, member.source)


def _digest(run_dir: Path, member: Member) -> str:
    fd = _open_member(run_dir, member)
    try:
        sha = hashlib.sha256()
        for data in _chunks(fd, member.size):
            sha.update(data)
        return sha.hexdigest()
    finally:
        os.close(fd)


def _info(name: str, size: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, mtime, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def mtime_of(stamp: str) -> int:
    """Seconds since the epoch for an ISO 8601 UTC stamp ('...Z'); 0 when it cannot be read."""
    try:
        return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    except (ValueError, OverflowError):
        return 0


def with_extra(selection: Selection, extra: Mapping[str, Path]) -> Selection:
    """selection plus files the renderer wrote (by member name), unless a member has that name."""
    taken = {m.name for m in selection.members}
    added = [
        Member(name, str(path.resolve()), path.stat().st_size)
        for name, path in extra.items()
        if name not in taken
    ]
    members = sorted(selection.members + added, key=lambda m: m.name)
    return Selection(members, selection.left_out, selection.source)


def bundle(
    run_dir: Path,
    dest: Path,
    run_id: str,
    finished_at: str = "",
    extra: Mapping[str, Path] | None = None,
    selection: Selection | None = None,
) -> Path:
    """Write dest (a .tar.gz) from the selected files of run_dir plus extra files by member name
    (reports rendered by this command); every member lives under hvconform-<run_id>/."""
    prefix = "hvconform-" + (re.sub(r"[^A-Za-z0-9._-]", "_", run_id)[:100] or "run")
    dest_rel = os.path.relpath(dest.resolve(), run_dir.resolve())
    chosen = selection or select(run_dir, frozenset({dest_rel}))
    chosen = with_extra(chosen, extra or {})
    sums = "".join(f"{_digest(run_dir, m)}  {m.name}\n" for m in chosen.members).encode()
    mtime = mtime_of(finished_at)
    with (
        atomic_file(dest) as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=mtime) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        tar.addfile(_info(f"{prefix}/{SUMS}", len(sums), mtime), io.BytesIO(sums))
        for member in chosen.members:
            fd = _open_member(run_dir, member)
            try:
                stream = _Stream(_chunks(fd, member.size))
                tar.addfile(_info(f"{prefix}/{member.name}", member.size, mtime), stream)
            finally:
                os.close(fd)
    return dest
