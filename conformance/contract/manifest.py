"""The run's manifest: the files one run wrote into its directory, listed by the run itself.

`hvconform run` starts from a new or empty results directory (anything else is refused before the
run begins), so once pytest has finished everything in it was written by the run; `inventory`
lists those files and `write` keeps the list as manifest.json. The evidence bundle takes only
what the manifest names: a private key or a large file that lands next to the results later, by
hand or by a careless `--out`, is never bundled.

A listed name is a relative path inside the run directory: no '..', no absolute path, no hidden
component, no control character. Symlinks are never listed (nor, when bundling, followed).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from hvconform.contract import strict_json
from hvconform.contract.safewrite import write_atomic

NAME = "manifest.json"
SCHEMA = "hvconform-manifest/1"
MAX_FILES = 100_000  # a run writes tens of files; a manifest naming more is not one of ours


class ManifestError(ValueError):
    """manifest.json exists but is not one this suite wrote (one line)."""


def safe_name(name: str) -> str | None:
    """Why name cannot be a member of the run directory, or None when it can."""
    if not name or name.startswith("/"):
        return "not a relative path"
    if any(not c.isprintable() for c in name):
        return "a control character in the name"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "outside the run directory"
    if any(p.startswith(".") for p in parts):
        return "a hidden name"
    return None


def inventory(run_dir: Path) -> list[str]:
    """Every regular file under run_dir, as sorted relative names: symlinks are neither listed
    nor followed, hidden names and temporary files (*.tmp) are skipped, and so is the manifest."""
    found = []
    for root, dirs, names in os.walk(run_dir, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            path = Path(root) / name
            rel = path.relative_to(run_dir).as_posix()
            if rel == NAME or name.endswith(".tmp") or safe_name(rel) is not None:
                continue
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue  # removed while listed
            if stat.S_ISREG(mode):
                found.append(rel)
    return sorted(found)


def write(run_dir: Path, files: list[str]) -> Path:
    path = run_dir / NAME
    return write_atomic(path, json.dumps({"schema": SCHEMA, "files": files}, indent=1) + "\n")


def read(run_dir: Path) -> list[str] | None:
    """The names the run's manifest lists; None when the run keeps no manifest (an older run,
    results written by pytest alone). ManifestError when the file is not a manifest."""
    path = run_dir / NAME
    if not os.path.lexists(path):
        return None
    if path.is_symlink():
        raise ManifestError(f"{path}: a symlink, not the run's manifest")
    try:
        data = strict_json.load(path, label="manifest")
    except strict_json.JsonInputError as exc:
        raise ManifestError(str(exc)) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ManifestError(f"{path}: not a {SCHEMA} manifest")
    files = data.get("files")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise ManifestError(f"{path}: 'files' is not a list of names")
    if len(files) > MAX_FILES:
        raise ManifestError(f"{path}: {len(files)} files, more than {MAX_FILES}")
    return sorted(set(files))
