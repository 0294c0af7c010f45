"""Facts a target adds to results.json: image IDs, runtime inspection, every workload run.

A target (in a pytest worker) keeps them in <out>/targets/<worker>.json, rewritten atomically
whenever it learns something, so a crashed worker still leaves what it saw. The run controller
merges every worker's file into results.json (`environment.targets.<worker>`), and each entry
of a list that names the check it ran under also becomes a note on that check's record.
Standard library only.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hvconform.contract.safewrite import write_atomic

_RUNNING: list[str] = []  # the check whose scenario or restore runs now, in this worker


@contextlib.contextmanager
def running(check_id: str) -> Iterator[None]:
    """What this worker runs from now until the block ends: the suite's run_check says so."""
    _RUNNING[:] = [check_id]
    try:
        yield
    finally:
        _RUNNING.clear()


def current_check() -> str:
    """The id of the check running now ('' outside one: a session fixture set up before the
    first check belongs to no check)."""
    return _RUNNING[0] if _RUNNING else ""


class TargetReport:
    """The per-worker file; values must be JSON-serialisable."""

    def __init__(self, out_dir: Path, worker: str) -> None:
        self.path = out_dir / "targets" / f"{worker}.json"
        self.data: dict[str, Any] = {}

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.write()

    def append(self, key: str, item: dict[str, Any], note: str = "") -> None:
        """Add an entry to a list; `note` (if given) goes to the running check's record."""
        entry = {"check": current_check(), **item}
        if note:
            entry["note"] = note
        self.data.setdefault(key, []).append(entry)
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(self.data, indent=2, sort_keys=True) + "\n")


def merge_reports(out: Path, records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every worker's report by worker name; notes added to `records` (check id -> record)."""
    merged: dict[str, Any] = {}
    for path in sorted((out / "targets").glob("*.json")):
        data = json.loads(path.read_text())
        merged[path.stem] = data
        for value in data.values():
            for entry in value if isinstance(value, list) else []:
                if not isinstance(entry, dict):
                    continue
                record = records.get(str(entry.get("check", "")))
                if record is not None and entry.get("note"):
                    record.setdefault("notes", []).append(f"{path.stem}: {entry['note']}")
    return merged
