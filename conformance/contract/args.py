"""Command-line pieces every hvconform subcommand shares: one-line usage errors, output paths.

In the contract so that each subcommand's module (metadata, bench, report) can use them without
importing hvconform's own CLI.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn

from hvconform.contract import imageref
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


# argparse `type`s of the flags several targets' options share.


def image_arg(
    *, pinned: bool, env: str = "", environ: Mapping[str, str] | None = None
) -> Callable[[str], str]:
    """An argparse `type` for an image flag: the reference (hvconform.contract.imageref),
    pinned when asked; empty means not given. argparse also applies it to the default, so the
    flag's environment variable (`env`, its value in `environ`, the CLI's reading) is checked
    too; a refusal is OneLineParser's one line, exit 2,
    before anything runs (no image built, no directory made)."""

    def check(raw: str) -> str:
        problem = imageref.problem(raw, pinned=pinned) if raw else None
        if problem:
            from_env = bool(env) and (environ or {}).get(env) == raw
            raise argparse.ArgumentTypeError(
                problem + (f" (the value of {env})" if from_env else "")
            )
        return raw

    return check


DOCKER_HOST_SCHEMES = ("unix://", "tcp://", "ssh://")  # what the docker CLI's -H accepts here


def docker_host_arg(environ: Mapping[str, str]) -> Callable[[str], str]:
    """An argparse `type` for --docker-host: empty (a private engine), or an engine URL."""
    return lambda raw: _docker_host(raw, environ)


def _docker_host(raw: str, environ: Mapping[str, str]) -> str:
    if raw and (not raw.startswith(DOCKER_HOST_SCHEMES) or any(c.isspace() for c in raw)):
        raise argparse.ArgumentTypeError(
            f"{raw!r}: an engine URL ({', '.join(s + '...' for s in DOCKER_HOST_SCHEMES)})"
            + (" (the value of HV_DOCKER_HOST)" if environ.get("HV_DOCKER_HOST") == raw else "")
        )
    return raw


def values_key_arg(raw: str) -> str:
    """An argparse `type` for --values-for: a per-target key a profile may name."""
    from hvconform.contract.deploy import values_key_problem

    if raw and (problem := values_key_problem(raw)):
        raise argparse.ArgumentTypeError(problem)
    return raw


def values_file_arg(raw: str) -> str:
    """An argparse `type` for --values: a YAML mapping in a regular file, read by the strict
    loader (size caps, no aliases bombs, no duplicate keys); its absolute path."""
    from hvconform.contract.safeyaml import MAX_FILE_BYTES, UnsafeInput, load_strict, read_bounded

    try:
        data = load_strict(read_bounded(raw, MAX_FILE_BYTES), raw)
    except UnsafeInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if data is not None and not isinstance(data, dict):
        raise argparse.ArgumentTypeError(f"{raw}: want a mapping of chart values")
    return str(Path(raw).resolve())
