"""Helpers of the setup tests: stand-in programs, an interpreter out of uid 65534's reach, and a
fresh checkout of this repository where a new user would put one, with its own interpreter.

`git clone` of this checkout's HEAD (committed work only, as a user's clone would be) into the
directory a test chooses: below a 0700 directory (root's home, `mktemp -d`) or a path with a
space. The clone gets `.venv` made by the base interpreter of the running one, without pip: its
`python` is a link that only root can follow there, exactly like a venv made by `./dev` in that
place. The dependencies come from the test session's own site-packages through a .pth file, so
no package is downloaded; the clone's own sources come first on sys.path (nothing of this
checkout, whose editable install is not processed there, is imported from the clone).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def standin(bin_dir: Path, name: str, output: str, code: int = 0, config: str = "") -> Path:
    """An executable `name` printing output (and `config` for `name config default`)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / name
    body = f"if [ \"$1\" = config ]; then printf '%s\\n' '{config}'; exit 0; fi\n" if config else ""
    script.write_text(f"#!/bin/sh\n{body}printf '%s\\n' '{output}'\nexit {code}\n")
    script.chmod(0o755)
    return script


@contextlib.contextmanager
def unreachable_python() -> Iterator[Path]:
    """/usr/bin/python3 behind a 0700 directory: root runs it, uid 65534 cannot."""
    top = Path(tempfile.mkdtemp(prefix="hv-0700-"))
    try:
        (top / "python3").symlink_to("/usr/bin/python3")
        yield top / "python3"
    finally:
        (top / "python3").unlink(missing_ok=True)
        top.rmdir()


@dataclass(frozen=True)
class Checkout:
    root: Path
    python: Path  # the clone's venv interpreter
    commit: str
    seconds: float  # clone + venv

    def hvconform(
        self, *args: str, timeout: float = 900, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`hvconform ARGS` as the clone's own interpreter runs it, from the clone."""
        return subprocess.run(
            [str(self.python), "-m", "hvconform.cli", *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            check=False,
        )


def head_commit(repo: Path = REPO) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def fresh_checkout(dest: Path, repo: Path = REPO) -> Checkout:
    """Clone repo's HEAD to dest (which must not exist) and give it a venv of its own."""
    t0 = time.monotonic()
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(repo), str(dest)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    base = getattr(sys, "_base_executable", "") or sys.executable
    venv = dest / ".venv"
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    deps = sysconfig.get_paths()["purelib"]  # this session's packages: pytest, grpc, jinja2...
    # The clone on the path for its tests/ (the suite's mutants and fixtures), this session's
    # dependencies, and the clone's own packages as a checkout gets them: an editable install,
    # the only way the folders import under their names (no index: the build backend and the
    # dependencies are this session's).
    Path(site, "hv-checkout.pth").write_text(f"{dest}\n{deps}\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    subprocess.run(
        [*pip, "--no-deps", "--no-build-isolation", "--no-index", "-e", str(dest)],
        check=True, capture_output=True, timeout=300, cwd=dest,
    )  # fmt: skip
    commit = head_commit(dest)
    return Checkout(dest, python, commit, time.monotonic() - t0)
