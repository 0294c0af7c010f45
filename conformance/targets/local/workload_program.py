"""What a workload runs: an interpreter uid 65534 can execute and a guest program it can read.

Workloads run as uid/gid 65534 with no capabilities, so every directory on the way to their
interpreter and their program must be searchable by others. A checkout below a 0700 directory
(root's home, anything `mktemp -d` made) is not, and a venv's interpreter may live there too.
So the guest program (conformance/guest, standard library only, plus the empty package file
above it) is copied into a directory of its own below /tmp (directories 0755, files 0644), and
the interpreter is the first candidate that really runs it as uid/gid through the runtime:
HV_WORKLOAD_PYTHON when set (then the only one), else this interpreter, its venv's base
interpreter, /usr/bin/python3 and python3 on PATH. When none can, the local target's
preconditions stop the run before its first check with one line that says what to change.

One staged copy per process, made on first use and removed when the process exits: a workload
may only run while its node (and so this process) lives.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hvconform.contract import settings
from hvconform.contract.datafiles import import_name, package_dir

# The suite's package where it is imported from (the checkout's conformance/, or
# site-packages/hvconform): the guest is there. A workload imports it under its import name.
SUITE_PACKAGE = package_dir()
GUEST_PACKAGE = f"{import_name()}.guest"
PYTHON_ENV = settings.ENV["workload_python"][0]
STAGE_PARENT = Path("/tmp")  # world-searchable (1777) on every Linux system
STAGE_PREFIX = "hvconform-guest-"  # then the owning pid
MIN_PYTHON = (3, 11)
FIX = (
    "install Debian's python3 (>= 3.11: apt-get install python3) or set "
    f"{PYTHON_ENV} to a Python >= 3.11 outside 0700 directories"
)
# What a candidate must do as the workload's uid/gid: import the staged guest, be new enough.
PROBE = f"import sys, {GUEST_PACKAGE}; sys.exit(0 if sys.version_info >= {MIN_PYTHON!r} else 3)"


class NoWorkloadPython(LookupError):
    """No candidate interpreter runs the guest as the workload's uid/gid; one line, with FIX."""


@dataclass(frozen=True)
class Program:
    python: str  # the interpreter a workload execs
    pythonpath: str  # the staged copy holding conformance/guest

    def command(self, *args: str) -> tuple[list[str], dict[str, str]]:
        return [self.python, "-m", GUEST_PACKAGE, *args], {"PYTHONPATH": self.pythonpath}


def guest_sources(package: Path = SUITE_PACKAGE) -> list[Path]:
    """The files a workload needs, below the suite's package: the guest package and the suite's
    __init__ (the guest imports nothing else, an import-linter contract holds it to that)."""
    return [package / "__init__.py", *sorted((package / "guest").glob("*.py"))]


def stage(dest: Path, package: Path = SUITE_PACKAGE) -> Path:
    """Copy the guest program below dest (as dest/hvconform/guest), readable by everyone;
    returns its PYTHONPATH."""
    dest.chmod(0o755)
    for source in guest_sources(package):
        target = dest / import_name() / source.relative_to(package)
        for parent in reversed(target.relative_to(dest).parents[:-1]):
            (dest / parent).mkdir(mode=0o755, exist_ok=True)
            (dest / parent).chmod(0o755)  # mkdir's mode is masked by the umask
        shutil.copyfile(source, target)
        target.chmod(0o644)
    return dest


def candidates() -> list[str]:
    """Interpreters to try, in order, without duplicates."""
    forced = settings.current().workload_python
    if forced:
        return [forced]
    base = getattr(sys, "_base_executable", "") or ""
    found = [sys.executable, base, "/usr/bin/python3", shutil.which("python3") or ""]
    return list(dict.fromkeys(c for c in found if c))


Runner = Callable[[list[str], dict[str, str]], tuple[int, str]]


def choose_python(pythonpath: str, run: Runner, uid: int, gid: int) -> str:
    """The first candidate that imports the staged guest as uid/gid (run: argv, env ->
    (exit code, error text)); NoWorkloadPython names every candidate and why it failed."""
    tried = []
    for python in candidates():
        code, error = run([python, "-c", PROBE], {"PYTHONPATH": pythonpath})
        if code == 0:
            return python
        lines = error.strip().splitlines()
        why = "older than 3.11" if code == 3 else (lines[-1] if lines else f"exit {code}")
        tried.append(f"{python}: {why}")
    raise NoWorkloadPython(
        f"no Python >= 3.11 that uid {uid} gid {gid} can execute with the guest program "
        f"(tried {'; '.join(tried)})"
    )


class _Stage:
    """The process's staged copy: made once (thread-safe), removed at exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dir: Path | None = None
        self._pid = 0

    def path(self) -> Path:
        with self._lock:
            if self._dir is None or self._pid != os.getpid():  # a fork gets its own copy
                prefix = f"{STAGE_PREFIX}{os.getpid()}-"  # the owner: a leak is attributable
                self._dir = Path(tempfile.mkdtemp(prefix=prefix, dir=STAGE_PARENT))
                self._pid = os.getpid()
                atexit.register(_remove, self._dir, self._pid)
                stage(self._dir)
            return self._dir


def _remove(path: Path, pid: int) -> None:
    if os.getpid() == pid:  # never a parent's copy from a forked child
        shutil.rmtree(path, ignore_errors=True)


STAGE = _Stage()
