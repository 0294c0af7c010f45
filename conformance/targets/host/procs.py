"""Process and namespace inspection shared by the local and container families (stdlib only).

`python -m hvconform.targets.host.launcher` must not pull in pyroute2 or grpc, so these
helpers import nothing outside the standard library; the harness-side `read_handshake` pairs
with the launcher's --exec-fd.
"""

from __future__ import annotations

import os
import select
import time
from pathlib import Path


def read_handshake(fd: int, timeout_s: float, what: str) -> str:
    """Parent side of the launcher's --exec-fd: read to EOF and close.

    "" means ARGV was exec'ed (the fd is close-on-exec in the launcher); otherwise the launcher
    wrote "CODE:message" and exited with CODE.
    """
    deadline = time.monotonic() + timeout_s
    data = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out after {timeout_s}s waiting for {what} to exec")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    return data.decode(errors="replace")
                data += chunk
    finally:
        os.close(fd)


def process_state(pid: int) -> str | None:
    """The state letter from /proc/<pid>/stat (R, S, Z, ...), None when the pid is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    return process_state(pid) not in (None, "Z")


def mount_namespace(pid: int) -> str | None:
    """The `mnt:[inode]` of a process, None when it is gone."""
    try:
        return str(Path(f"/proc/{pid}/ns/mnt").readlink())
    except OSError:
        return None


def namespace_members(mnt_ns: str) -> list[int]:
    """Live processes whose mount namespace is `mnt_ns`: what keeps its mounts alive."""
    pids = (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())
    return [pid for pid in pids if mount_namespace(pid) == mnt_ns and alive(pid)]


def mount_points(pid: int | str = "self") -> list[str]:
    """Mount points as process `pid` sees them (repeated when mounts are stacked)."""
    lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    return [line.split()[4].replace("\\040", " ") for line in lines]


def proc_status(pid: int | str = "self") -> dict[str, str]:
    """/proc/<pid>/status as field -> whitespace-normalised value."""
    fields: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = " ".join(value.split())
    return fields
