"""What /proc says about the plugin's processes and threads, and about the machine."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
# Where an idle thread sleeps tells Python threads apart (their comm is just "python").
_SYSCALLS_X86_64 = {
    0: "read",
    7: "poll",
    23: "select",
    35: "nanosleep",
    61: "wait4",
    202: "futex",
    230: "clock_nanosleep",
    232: "epoll_wait",
    270: "pselect6",
    271: "ppoll",
    281: "epoll_pwait",
    441: "epoll_pwait2",
}


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the comm (state is [0]); None once the pid is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm is parenthesised and may itself hold spaces or ')': split after the last one.
    return raw.rsplit(")", 1)[1].split()


def children(pid: int) -> list[int]:
    """Direct children of every thread of pid (cheap: no scan of /proc)."""
    kids: list[int] = []
    try:
        tids = [t.name for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return kids
    for tid in tids:
        with contextlib.suppress(OSError):
            kids += [int(k) for k in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    return kids


def process_tree(pid: int) -> list[int]:
    """pid and every live descendant (the plugin and its probe helper)."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        if _stat_fields(current) is None:
            continue
        tree.append(current)
        todo.extend(children(current))
    return tree


def comm(pid: int, tid: int | None = None) -> str:
    path = f"/proc/{pid}/task/{tid}/comm" if tid is not None else f"/proc/{pid}/comm"
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "?"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def rss_kib(pid: int) -> int:
    """VmRSS of one process in KiB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """utime + stime of a whole thread group (exited threads included), in seconds."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


@dataclass(frozen=True)
class ThreadSample:
    """One thread's counters at one moment."""

    pid: int
    tid: int
    comm: str
    voluntary: int
    nonvoluntary: int
    runtime_ns: int
    blocked_in: str = ""


def blocked_in(pid: int, tid: int) -> str:
    """The system call a thread sleeps in ("running" when on a CPU), from /proc/.../syscall."""
    try:
        first = Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return "?"
    if not first.lstrip("-").isdigit():
        return first
    number = int(first)
    if platform.machine() == "x86_64":
        return _SYSCALLS_X86_64.get(number, f"syscall {number}")
    return f"syscall {number}"


def threads(pid: int, *, where: bool = False) -> list[ThreadSample]:
    """Every live thread of pid: voluntary switches (wake-ups), CPU time (schedstat, ns) and,
    with `where`, the system call it sleeps in."""
    out: list[ThreadSample] = []
    try:
        tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return out
    for tid in tids:
        base = Path(f"/proc/{pid}/task/{tid}")
        try:
            status = base.joinpath("status").read_text()
            runtime = int(base.joinpath("schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread exited between listdir and read
        counts = {
            k: int(v)
            for k, v in (line.split(":", 1) for line in status.splitlines() if "ctxt" in line)
        }
        out.append(
            ThreadSample(
                pid,
                tid,
                comm(pid, tid),
                counts.get("voluntary_ctxt_switches", 0),
                counts.get("nonvoluntary_ctxt_switches", 0),
                runtime,
                blocked_in(pid, tid) if where else "",
            )
        )
    return out


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat; busy excludes idle+iowait."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def busy_pct(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Share of all CPUs busy (any process) between two cpu_jiffies() readings."""
    total = after[1] - before[1]
    return 100.0 * (after[0] - before[0]) / total if total > 0 else 0.0


def machine() -> dict[str, object]:
    """Cores, CPU model, kernel, Python and grpcio versions; load is added by the caller."""
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    import grpc

    return {
        "cores": os.cpu_count() or 0,
        "cpu_model": model,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "grpcio": grpc.__version__,
        "hostname": platform.node(),
    }


class Span:
    """The machine's load over one series: 1-min load average at its start, CPU busy over it."""

    def __init__(self) -> None:
        self._load1 = loadavg()[0]
        self._jiffies = cpu_jiffies()

    def load(self) -> dict[str, float]:
        return {
            "load1_start": self._load1,
            "busy_pct": round(busy_pct(self._jiffies, cpu_jiffies()), 1),
        }
