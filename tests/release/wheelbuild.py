"""The release artefacts as a user gets them, built from a copy of the checkout's sources.

`build_wheel` does what `python -m build` does (an sdist, then the wheel built from the unpacked
sdist, through setuptools' PEP 517 backend), without build isolation: the backend is this venv's
setuptools, so no index is needed. It builds from a private copy of the sources, so nothing is
written into the checkout (setuptools puts its egg-info and build/ beside the sources) while
other runs read it. `interpreter` finds a Python by version where this machine keeps one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

# The selection every wheel run judges: the guest and the CDI repairs (about 10 s a run).
SELECTION = ("-m", "guest or cdi")
# What the sdist is built from: the project files and every folder it takes files from.
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE")
FOLDERS = ("plugin", "conformance", "charts", "kind")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "_data", "bin")
_BACKEND = "import sys; from setuptools import build_meta as b; print(b.{}(sys.argv[1]))"


def _backend(hook: str, source: Path, out: Path) -> Path:
    """Run one PEP 517 hook in `source`; the file it wrote into `out`."""
    proc = subprocess.run(
        [sys.executable, "-c", _BACKEND.format(hook), str(out)],
        cwd=source, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, f"{hook}: {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return out / proc.stdout.strip().splitlines()[-1]


def build_wheel(root: Path, work: Path) -> Path:
    """The sdist and the wheel of the checkout at `root`, in work/dist; the wheel's path."""
    source, dist, unpacked = work / "source", work / "dist", work / "unpacked"
    source.mkdir()
    for name in SOURCES:
        shutil.copy2(root / name, source / name)
    for name in FOLDERS:
        shutil.copytree(root / name, source / name, ignore=IGNORED)
    dist.mkdir()
    sdist = _backend("build_sdist", source, dist)
    with tarfile.open(sdist) as tar:
        tar.extractall(unpacked, filter="data")
    (top,) = unpacked.iterdir()
    return _backend("build_wheel", top, dist)


def interpreter(version: str) -> str:
    """A Python `version` (e.g. "3.13") this machine has: pyenv's builds (PYENV_ROOT, else
    ~/.pyenv), then /usr/local/bin, /usr/bin. An assertion names what to install otherwise: a
    claimed Python that cannot be tested fails, it never skips."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    patch = re.compile(re.escape(version) + r"\.(\d+)")
    builds = sorted(
        (int(m.group(1)), p / "bin" / f"python{version}")
        for p in (pyenv.iterdir() if pyenv.is_dir() else ())
        if (m := patch.fullmatch(p.name))
    )
    found = [str(b) for _, b in reversed(builds)]
    found += [f"/usr/local/bin/python{version}", f"/usr/bin/python{version}"]
    for python in found:
        if Path(python).is_file() and os.access(python, os.X_OK):
            return python
    raise AssertionError(
        f"no Python {version} here (looked in {pyenv} and /usr): `pyenv install {version}` "
        "(requires-python claims it, so it is tested)"
    )
