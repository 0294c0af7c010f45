"""Preconditions: every external component a target needs, checked before its first check.

A target family declares them in its `preflight` module (`preconditions(target, runtime)`, a
list of Requirements in the order they depend on each other) and says what it ran on
(`environment(target, runtime)`). The suite evaluates every requirement once, before any node
exists; the first unmet one ends the run: no check runs, every check is `environment_blocked`
with one line naming the component, the version found, the version needed and the command that
fixes it, and hvconform exits EXIT_ENVIRONMENT_BLOCKED. A wrong environment is never reported as
a failed check of the plugin. Versions are asked from the components themselves (`--version`),
never copied from constants. Standard library only.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# 1 is a failed check, 2 unusable input, 5 no check selected (cli.EXIT_NO_CHECKS); 3 and 4
# are pytest's own (internal error, usage error) and pass through hvconform unchanged.
EXIT_ENVIRONMENT_BLOCKED = 6
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
PROBE_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Found:
    """What a probe saw: a version (or "missing", "uid 1000", ...), whether it is fit, and
    where it was read from (the command line or file)."""

    found: str
    ok: bool
    source: str = ""


@dataclass(frozen=True)
class Finding:
    component: str
    feature: str
    need: str
    fix: str
    found: str
    ok: bool
    source: str

    def line(self) -> str:
        """The one line a blocked run prints and every blocked check carries."""
        return (
            f"{self.component}: found {self.found}, needs {self.need} "
            f"({self.feature}); fix: {self.fix}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "component": self.component,
            "feature": self.feature,
            "need": self.need,
            "found": self.found,
            "ok": self.ok,
            "source": self.source,
            **({} if self.ok else {"fix": self.fix}),
        }


@dataclass(frozen=True)
class Requirement:
    component: str  # what is needed: "containerd", "root", "/dev/kvm"
    feature: str  # what the target uses it for, e.g. "CDI device injection for the node target"
    need: str  # the version or property needed, human: ">= 1.7", "a usable character device"
    fix: str  # the command (or the change) that fixes it
    probe: Callable[[], Found]

    def check(self) -> Finding:
        try:
            seen = self.probe()
        except Exception as exc:  # a probe that breaks is an unfit component, not a crash
            seen = Found(f"unusable ({type(exc).__name__}: {exc})", False)
        fields = (self.component, self.feature, self.need, self.fix)
        return Finding(*fields, " ".join(seen.found.split()), seen.ok, seen.source)


def evaluate(requirements: Sequence[Requirement]) -> list[Finding]:
    """Every requirement checked, in order (the environment records them all)."""
    return [r.check() for r in requirements]


def first_unmet(findings: Sequence[Finding]) -> Finding | None:
    return next((f for f in findings if not f.ok), None)


def version_tuple(text: str) -> tuple[int, ...] | None:
    """The first dotted version in text: "containerd ... 1.6.20~ds1" -> (1, 6, 20)."""
    match = _VERSION.search(text)
    if match is None:
        return None
    return tuple(int(g) for g in match.groups() if g is not None)


def ask(argv: Sequence[str], timeout: float = PROBE_TIMEOUT_S) -> tuple[str | None, str]:
    """(first non-empty output line, command line) of a version command; None when the program
    is not on PATH or did not answer with exit 0."""
    shown = " ".join(argv)
    path = shutil.which(argv[0])
    if path is None:
        return None, shown
    try:
        res = subprocess.run(
            [path, *argv[1:]], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None, shown
    lines = [ln.strip() for ln in (res.stdout + "\n" + res.stderr).splitlines() if ln.strip()]
    if res.returncode != 0 or not lines:
        return None, shown
    return lines[0], shown


def tool(
    component: str,
    argv: Sequence[str],
    *,
    minimum: str | None,
    feature: str,
    fix: str,
    pattern: str = "",
) -> Requirement:
    """A program on PATH whose `argv` answers a version >= minimum (None: any version).

    `pattern` (a regex) picks the version out of the answer when it holds other numbers."""

    def probe() -> Found:
        line, shown = ask(argv)
        if line is None:
            where = "not on PATH" if shutil.which(argv[0]) is None else f"`{shown}` failed"
            return Found(f"missing ({where})", False, shown)
        text = line
        if pattern:
            match = re.search(pattern, line)
            text = match.group(1) if match else ""
        have = version_tuple(text)
        if have is None:
            return Found(f"unknown version ({line[:80]})", minimum is None, shown)
        found = ".".join(str(p) for p in have)
        want = version_tuple(minimum) if minimum else None
        return Found(found, want is None or have >= want, shown)

    need = f">= {minimum}" if minimum else "any version"
    return Requirement(component, feature, need, fix, probe)


def version_of(argv: Sequence[str], pattern: str = "") -> dict[str, str]:
    """A component's version for the environment: asked from the program itself."""
    line, shown = ask(argv)
    if line is None:
        return {"version": "unavailable", "command": shown}
    text = line
    if pattern:
        match = re.search(pattern, line)
        text = match.group(1) if match else line
    have = version_tuple(text)
    version = text if have is None else _full_version(text)
    return {"version": version, "command": shown, "output": line[:200]}


def _full_version(text: str) -> str:
    """The version token as printed (v1.37.2, 1.7.24~ds1-1), not only its numbers."""
    match = re.search(r"v?\d+\.\d+(?:\.\d+)?[^\s,;()]*", text)
    return match.group(0) if match else text
