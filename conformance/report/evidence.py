"""The evidence bundle: every file of the run directory in one deterministic tar.gz.

Same run directory, same bytes: members sorted, owner, mode and times fixed, gzip header without
a name or a clock. SHA256SUMS comes first so a reader can check any file without unpacking all.
Symlinks are never followed, so a link planted in the run directory cannot pull in host files.
"""

from __future__ import annotations

import calendar
import gzip
import hashlib
import io
import os
import re
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path

SUMS = "SHA256SUMS"


def collect(run_dir: Path, exclude: Path) -> list[tuple[str, bytes]]:
    """(relative posix path, content) of every regular file under run_dir, sorted by path."""
    found = []
    for root, dirs, names in os.walk(run_dir, followlinks=False):
        dirs.sort()
        for name in names:
            path = Path(root) / name
            if path == exclude or name.endswith(".tmp") or path.is_symlink() or not path.is_file():
                continue
            found.append((path.relative_to(run_dir).as_posix(), path.read_bytes()))
    return sorted(found)


def _member(tar: tarfile.TarFile, name: str, content: bytes, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(content), mtime, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(content))


def mtime_of(stamp: str) -> int:
    """Seconds since the epoch for an ISO 8601 UTC stamp ('...Z'); 0 when it cannot be read."""
    try:
        return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    except (ValueError, OverflowError):
        return 0


def bundle(
    run_dir: Path,
    dest: Path,
    run_id: str,
    finished_at: str = "",
    extra: Mapping[str, Path] | None = None,
) -> Path:
    """Write dest (a .tar.gz) from run_dir, plus extra files by member name (reports rendered
    outside the run dir); every member lives under hvconform-<run_id>/."""
    prefix = "hvconform-" + (re.sub(r"[^A-Za-z0-9._-]", "_", run_id) or "run")
    files = collect(run_dir, dest.resolve())
    taken = {rel for rel, _ in files}
    added = [(rel, path.read_bytes()) for rel, path in (extra or {}).items() if rel not in taken]
    files = sorted(files + added)
    sums = "".join(f"{hashlib.sha256(data).hexdigest()}  {rel}\n" for rel, data in files)
    mtime = mtime_of(finished_at)
    tmp = dest.with_name(dest.name + ".tmp")
    with (
        tmp.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=mtime) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        _member(tar, f"{prefix}/{SUMS}", sums.encode(), mtime)
        for rel, data in files:
            _member(tar, f"{prefix}/{rel}", data, mtime)
    tmp.replace(dest)
    return dest
