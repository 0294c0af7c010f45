"""The owner ledger: every resource the harness creates is written down, and proven gone at the end.

Entries are appended as JSON lines, so a ledger survives a crashed worker and can be verified by
another process (the controller verifies what every pytest-xdist worker created).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

KINDS = ("process", "mount", "netns", "link", "dir", "file", "socket", "container", "cgroup")


@dataclass(frozen=True)
class Entry:
    kind: str
    ident: str
    owner: str
    detail: str = ""


def _proc_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 (starttime) follows the parenthesised comm, which may itself contain spaces.
    return stat.rsplit(")", 1)[1].split()[19]


def process_ident(pid: int) -> str:
    """pid plus start time: a recycled pid is never mistaken for ours."""
    return f"{pid}:{_proc_start_time(pid) or '?'}"


def _mount_points() -> set[str]:
    points = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        points.add(line.split()[4].replace("\\040", " "))
    return points


def still_present(entry: Entry, mounts: set[str] | None = None) -> bool:
    """Whether the resource the entry names still exists on this machine."""
    if entry.detail.startswith("shared"):
        # Shared by concurrent runs (/run/netns): a leak only if it stays with nobody inside.
        path = Path(entry.ident)
        return path.is_dir() and not any(path.iterdir())
    if entry.kind == "process":
        pid, start = entry.ident.split(":", 1)
        current = _proc_start_time(int(pid))
        if current is None:
            return False
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return current == start and state != "Z"
    if entry.kind == "mount":
        return entry.ident in (mounts if mounts is not None else _mount_points())
    if entry.kind == "netns":
        return Path("/run/netns", entry.ident).exists()
    if entry.kind == "link":
        return Path("/sys/class/net", entry.ident).exists()
    if entry.kind == "cgroup":
        return Path(entry.ident).exists()
    if entry.kind in ("dir", "file", "socket"):
        return os.path.lexists(entry.ident)
    if entry.kind == "container":
        return False  # verified by the container target itself, which knows its engine
    raise ValueError(f"unknown ledger kind {entry.kind!r}")


class Ledger:
    """Append-only record of created resources, shared by every process of one run."""

    def __init__(self, path: Path, owner: str) -> None:
        self.path = path
        self.owner = owner
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, kind: str, ident: str, detail: str = "") -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown ledger kind {kind!r}")
        line = json.dumps(
            {"op": "created", "kind": kind, "ident": ident, "owner": self.owner, "detail": detail}
        )
        with self._lock, self.path.open("a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def record_process(self, pid: int, detail: str = "") -> None:
        self.record("process", process_ident(pid), detail)


def read_entries(paths: Iterable[Path]) -> list[Entry]:
    entries = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            raw = json.loads(line)
            entries.append(Entry(raw["kind"], raw["ident"], raw["owner"], raw.get("detail", "")))
    return entries


def survivors(entries: Iterable[Entry]) -> list[Entry]:
    """Entries whose resource still exists: the run leaked these."""
    mounts = _mount_points()
    return [e for e in entries if still_present(e, mounts)]
