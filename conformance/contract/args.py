"""Command-line pieces every hvconform subcommand shares: one-line usage errors, output paths.

In the contract so that each subcommand's module (metadata, bench, report) can use them without
importing hvconform's own CLI.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

from hvconform.contract.strict_json import one_line

EXIT_BAD_INPUT = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage itself is behind --help)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {one_line(message)} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def _creatable(flag: str, path: Path) -> str | None:
    """Why path cannot be created as a directory (its nearest existing ancestor), or None."""
    parent = path
    while not os.path.lexists(parent):
        parent = parent.parent
    if not parent.is_dir():
        return f"{flag} {path}: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{flag} {path}: cannot be created in {parent}: not writable"
    return None


def output_problem(flag: str, path: Path, *, must_be_empty: bool) -> str | None:
    """Why path cannot take a run's output: a file, a non-empty --out, unwritable; or None.

    --out must be new or empty so that everything in it afterwards was written by the run (its
    manifest, and so its evidence bundle, can then never take a file that was there before).
    """
    if not os.path.lexists(path):
        return _creatable(flag, path)
    if not path.is_dir():
        return f"{flag} {path}: exists and is not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{flag} {path}: not writable"
    if must_be_empty and any(os.scandir(path)):
        return f"{flag} {path}: not empty; a run writes into a new or empty directory"
    return None
