"""Where a pool's results are: directories and Sonobuoy tarballs, read strictly and in memory.

A directory is searched for files named results.json, never through a symlink. A Sonobuoy
tarball (`sonobuoy retrieve`) holds a node's files under plugins/<plugin>/results/<node>/,
possibly inside a nested results.tar.gz or out.tar.gz; it is read member by member and never
extracted: a member named absolute or with `..`, a link, a device or FIFO, a member over
MAX_MEMBER_BYTES, more than MAX_MEMBERS members or MAX_TAR_BYTES in all, or tarballs nested
deeper than MAX_NESTING refuse the whole input with one line (FleetError). Each results document
is read as `hvconform report` reads one: strict JSON within its caps, then the shipped schema.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from hvconform.contract import strict_json
from hvconform.contract.results import validate_results
from hvconform.report.render import (
    MAX_RESULTS_BYTES,
    MAX_RESULTS_VALUES,
    ReportError,
    load_results,
)

RESULTS = "results.json"
NESTED = frozenset({"results.tar.gz", "out.tar.gz"})
MAX_MEMBER_BYTES = 64 * 1024 * 1024
MAX_MEMBERS = 100_000
MAX_TAR_BYTES = 1024 * 1024 * 1024  # every member's size, nested ones included, per input
MAX_NESTING = 2
MAX_NODES = 5000


class FleetError(Exception):
    """An input or option that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Found:
    """One results document and where it came from."""

    source: str  # the file, or TARBALL!MEMBER
    data: dict[str, Any]
    sonobuoy_node: str = ""  # the Sonobuoy node directory it was under ("" when none)
    run_dir: Path | None = None  # the directory it lives in (None inside a tarball)


def _parse(raw: bytes, label: str) -> dict[str, Any]:
    """A results document from bytes, as strictly as load_results reads a file."""
    if len(raw) > MAX_RESULTS_BYTES:
        raise FleetError(f"{label}: more than {MAX_RESULTS_BYTES} bytes")
    try:
        data = strict_json.parse(
            strict_json.decode(raw, label=label), label=label, max_values=MAX_RESULTS_VALUES
        )
    except strict_json.JsonInputError as exc:
        raise FleetError(str(exc)) from None
    if not isinstance(data, dict):
        raise FleetError(f"{label}: does not follow the results schema: not an object")
    try:
        validate_results(data)
    except Exception as exc:  # jsonschema.ValidationError; jsonschema is untyped here
        message = strict_json.one_line(str(getattr(exc, "message", exc)))
        raise FleetError(f"{label}: does not follow the results schema: {message}") from None
    return data


def _from_dir(root: Path) -> Iterator[Found]:
    """Every results.json below root, in name order; a symlink by that name is refused."""
    for where, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        if RESULTS not in files:
            continue
        path = Path(where) / RESULTS
        if path.is_symlink():
            raise FleetError(f"{path}: a symlink, not read (give the results file itself)")
        try:
            yield Found(str(path), load_results(path), run_dir=path.parent)
        except ReportError as exc:
            raise FleetError(strict_json.one_line(str(exc))) from None


def _sonobuoy_node(name: str) -> str:
    """<node> of plugins/<plugin>/results/<node>/... ('' when the path is not laid out so)."""
    parts = PurePosixPath(name).parts
    for i, part in enumerate(parts[:-4]):
        if part == "plugins" and parts[i + 2] == "results":
            return parts[i + 3]
    return ""


def _member_problem(member: tarfile.TarInfo) -> str | None:
    name = member.name
    if name.startswith("/") or ".." in PurePosixPath(name).parts:
        return "a member name outside the archive (absolute or with ..)"
    if member.issym() or member.islnk():
        return f"a link ({'symbolic' if member.issym() else 'hard'}), refused"
    if member.isdir():
        return None
    if not member.isfile():
        return "neither a file nor a directory (a device or FIFO), refused"
    if member.size > MAX_MEMBER_BYTES:
        return f"{member.size} bytes, more than {MAX_MEMBER_BYTES} per member"
    return None


@dataclass
class _Budget:
    members: int = 0
    size: int = 0


def _walk_tar(
    tar: tarfile.TarFile, label: str, node: str, depth: int, budget: _Budget
) -> Iterator[Found]:
    for member in tar:
        budget.members += 1
        if budget.members > MAX_MEMBERS:
            raise FleetError(f"{label}: more than {MAX_MEMBERS} members")
        where = f"{label}!{strict_json.one_line(member.name, 200)}"
        problem = _member_problem(member)
        if problem:
            raise FleetError(f"{where}: {problem}")
        if member.isdir():
            continue
        budget.size += member.size
        if budget.size > MAX_TAR_BYTES:
            raise FleetError(f"{label}: members of more than {MAX_TAR_BYTES} bytes in all")
        base = PurePosixPath(member.name).name
        if base != RESULTS and base not in NESTED:
            continue
        handle = tar.extractfile(member)
        raw = handle.read(MAX_MEMBER_BYTES + 1) if handle is not None else b""
        here = node or _sonobuoy_node(member.name)
        if base == RESULTS:
            yield Found(where, _parse(raw, where), here)
            continue
        if depth >= MAX_NESTING:
            raise FleetError(f"{where}: tarballs nested more than {MAX_NESTING} deep")
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r|*") as inner:
            yield from _walk_tar(inner, where, here, depth + 1, budget)


def _from_tar(path: Path) -> Iterator[Found]:
    try:
        with tarfile.open(path, mode="r|*") as tar:
            yield from _walk_tar(tar, str(path), "", 1, _Budget())
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise FleetError(f"{path}: not a readable tarball: {strict_json.one_line(why)}") from None


def find(paths: Sequence[Path]) -> list[Found]:
    """Every results document in the inputs (directories, tarballs, results.json files)."""
    found: list[Found] = []
    for path in paths:
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            raise FleetError(f"{path}: {exc.strerror or exc}") from None
        if stat.S_ISDIR(mode):
            here = list(_from_dir(path))
        elif stat.S_ISREG(mode) and path.name == RESULTS:
            here = list(_from_dir_file(path))
        elif stat.S_ISREG(mode):
            here = list(_from_tar(path))
        else:
            raise FleetError(f"{path}: neither a directory nor a file")
        if not here:
            raise FleetError(f"{path}: holds no {RESULTS}")
        found += here
        if len(found) > MAX_NODES:
            raise FleetError(f"more than {MAX_NODES} results files in the inputs")
    return found


def _from_dir_file(path: Path) -> Iterator[Found]:
    try:
        yield Found(str(path), load_results(path), run_dir=path.parent)
    except ReportError as exc:
        raise FleetError(strict_json.one_line(str(exc))) from None
