"""Host processes the node stack owns: started into their own session, recorded by pid AND start
time (a recycled pid is never signalled), stopped by id with SIGTERM then SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hvconform.targets.realnode import CACHE, RUN

PIDS = RUN / "pids"
LOGS = CACHE / "logs" / "node"  # outside RUN: kept after node-down for the report


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks since boot), None when gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


@dataclass(frozen=True)
class Proc:
    name: str
    pid: int
    started: int

    @property
    def alive(self) -> bool:
        return start_time(self.pid) == self.started

    def send(self, sig: int) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def stop(self, timeout_s: float = 15.0, sig: int = signal.SIGTERM) -> bool:
        """Signal, wait, then SIGKILL; True when it ended within the timeout of the first signal."""
        self.send(sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            _reap(self.pid)
            if not self.alive:
                return True
            time.sleep(0.05)
        self.send(signal.SIGKILL)
        while self.alive:
            _reap(self.pid)
            time.sleep(0.05)
        return False


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def start(
    name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> Proc:
    """Start argv in its own session, output appended to LOGS/<name>.log, recorded in PIDS."""
    PIDS.mkdir(parents=True, exist_ok=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    with (LOGS / f"{name}.log").open("ab") as log:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )
    started = start_time(popen.pid)
    if started is None:
        popen.wait()
        raise RuntimeError(f"{name} exited at once ({popen.returncode}): {log_tail(name)}")
    proc = Proc(name, popen.pid, started)
    (PIDS / f"{name}.json").write_text(json.dumps({"pid": proc.pid, "started": started}))
    return proc


def record(name: str, pid: int) -> Proc:
    """Record a process started elsewhere (the sandboxed plugin), so node-down stops it too."""
    started = start_time(pid)
    if started is None:
        raise RuntimeError(f"{name} (pid {pid}) is not running")
    PIDS.mkdir(parents=True, exist_ok=True)
    (PIDS / f"{name}.json").write_text(json.dumps({"pid": pid, "started": started}))
    return Proc(name, pid, started)


def recorded(name: str) -> Proc | None:
    try:
        data = json.loads((PIDS / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    return Proc(name, int(data["pid"]), int(data["started"]))


def forget(name: str) -> None:
    (PIDS / f"{name}.json").unlink(missing_ok=True)


def log_tail(name: str, lines: int = 20) -> str:
    try:
        text = (LOGS / f"{name}.log").read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def pids_with_exe_under(root: Path) -> list[int]:
    """Processes whose executable is below root (what node-down must leave none of)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = str((entry / "exe").readlink())
        except OSError:
            continue
        if exe.startswith(str(root) + "/"):
            found.append(int(entry.name))
    return found


def pids_with_arg(needle: str) -> list[int]:
    """Processes with needle as one of their arguments (containerd shims name our socket)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle.encode() in args:
            found.append(int(entry.name))
    return found
