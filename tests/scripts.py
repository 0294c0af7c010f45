"""Executable Python stand-ins for tests, runnable from any checkout path.

A `#!` line cannot hold a path with a space (the kernel splits it), and a checkout may live in
one (README: "from any checkout location"). So a stand-in is two files: its Python body, and a
`/bin/sh` launcher that execs this interpreter on it with the arguments, every path quoted.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def python_script(path: Path, body: str) -> Path:
    """Write an executable at `path` that runs `body` (Python) with this interpreter."""
    source = path.with_name(path.name + ".py")
    source.write_text(body)
    path.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(source))} "$@"\n'
    )
    path.chmod(0o755)
    return path
