"""Version and source commit of the running plugin, for --version and the start-up log.

The version is defined once, in pyproject.toml, and read back from the installed package's
metadata. The commit is baked into the image at build time (HV_SOURCE_COMMIT, from the
Dockerfile's SOURCE_COMMIT build argument); in a git checkout it is asked of git; else "unknown".
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from plugin.api.names import installed_version

COMMIT_ENV = "HV_SOURCE_COMMIT"
UNKNOWN = "unknown"
GIT_TIMEOUT_S = 5.0
# A commit id, perhaps abbreviated, perhaps with a "-dirty" mark: anything else is not shown.
_COMMIT = re.compile(r"[0-9a-f]{7,64}(?:-dirty)?")


def version() -> str:
    return installed_version()  # plugin.api.names reads it; the conformance suite does too


def source_commit() -> str:
    baked = os.environ.get(COMMIT_ENV, "").strip().lower()
    if baked:
        return baked if _COMMIT.fullmatch(baked) else UNKNOWN
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return UNKNOWN
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    return out if _COMMIT.fullmatch(out) else UNKNOWN
