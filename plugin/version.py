"""Version and source commit of the running plugin, for --version and the start-up log.

The version is defined once, in pyproject.toml, and read back from the installed package's
metadata. The commit is baked into the image at build time (HV_SOURCE_COMMIT, from the
Dockerfile's SOURCE_COMMIT build argument); in a git checkout it is read from git's files; else
"unknown".
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from hv_device_plugin.api.names import installed_version

COMMIT_ENV = "HV_SOURCE_COMMIT"
UNKNOWN = "unknown"
# A commit id, perhaps abbreviated, perhaps with a "-dirty" mark: anything else is not shown.
_COMMIT = re.compile(r"[0-9a-f]{7,64}(?:-dirty)?")


def version() -> str:
    return (
        installed_version()
    )  # hv_device_plugin.api.names reads it; the conformance suite does too


@functools.cache
def source_commit() -> str:
    """Baked in, else read from the checkout's git files (no git process: a fork and exec cost
    the plugin's start-up ~10 ms, and the image has no git), else "unknown"."""
    baked = os.environ.get(COMMIT_ENV, "").strip().lower()
    if baked:
        return baked if _COMMIT.fullmatch(baked) else UNKNOWN
    found = _git_head(Path(__file__).resolve().parent.parent / ".git")
    return found if _COMMIT.fullmatch(found) else UNKNOWN


def _git_head(dot_git: Path) -> str:
    """HEAD's commit from the files git keeps: HEAD, then the loose ref, then packed-refs."""
    try:
        if dot_git.is_file():  # a worktree or submodule: "gitdir: <path>"
            pointer = dot_git.read_text().strip().removeprefix("gitdir:").strip()
            dot_git = (dot_git.parent / pointer).resolve()
        head = (dot_git / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head  # detached
        ref = head.removeprefix("ref:").strip()
        common = dot_git
        if (dot_git / "commondir").is_file():
            common = (dot_git / (dot_git / "commondir").read_text().strip()).resolve()
        for base in (dot_git, common):
            if (base / ref).is_file():
                return (base / ref).read_text().strip()
        for line in (common / "packed-refs").read_text().splitlines():
            sha, _, name = line.partition(" ")
            if name == ref:
                return sha
    except OSError:
        pass
    return UNKNOWN
