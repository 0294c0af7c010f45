"""Which `kind` executable a kind run uses: the one on PATH, else the one `nox -s kind-image`
built from its module into the cache (KIND_BIN). Stdlib only: the kind target and the node
image builder (hvconform.targets.kindnode) both read these names from here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

KIND_VERSION = "v0.33.0"  # sigs.k8s.io/kind, built with `go install` when none is on PATH
KIND_CACHE = Path(os.environ.get("HV_KIND_CACHE", "/var/cache/hv-kind"))
KIND_BIN = KIND_CACHE / "gobin" / "kind"


def kind_executable() -> str:
    """The kind to run: PATH's first, then the cache's; "kind" (fails with 127) when neither."""
    found = shutil.which("kind")
    if found:
        return found
    return str(KIND_BIN) if os.access(KIND_BIN, os.X_OK) else "kind"


def kind_env() -> dict[str, str] | None:
    """The environment kind runs with: None (inherited) unless the cache's kind is the one, then
    PATH with the cache's directory first, so `kind` resolves as it does on CI."""
    if kind_executable() != str(KIND_BIN):
        return None
    return {**os.environ, "PATH": f"{KIND_BIN.parent}:{os.environ.get('PATH', '')}"}


def kind_facts(node_image: str) -> dict[str, str]:
    """Which kind and node image a run used, for the report and the console."""
    executable = kind_executable()
    return {"kind": executable, "kind_version": kind_version(executable), "node_image": node_image}


def kind_version(executable: str) -> str:
    """`kind version`'s first word after the name ("kind v0.33.0 go1.26 linux/amd64")."""
    try:
        out = subprocess.run(
            [executable, "version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout.split()
    except OSError:
        return "unavailable"
    return out[1] if len(out) > 1 else "unknown"


def main() -> int:
    """`python -m hvconform.targets.cluster.kindbin`: which kind a run would use; exit 2 when
    there is none (neither on PATH nor in the cache)."""
    executable = kind_executable()
    if executable == "kind":
        print(f"kind: none on PATH and none in {KIND_BIN}: `nox -s kind-image` builds it, or "
              f"`go install sigs.k8s.io/kind@{KIND_VERSION}`", file=sys.stderr)  # fmt: skip
        return 2
    print(f"kind: {executable} ({kind_version(executable)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
