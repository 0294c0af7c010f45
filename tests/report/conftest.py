"""Shared fixtures of the report tests: the fixed results files and a run directory per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "results"
GOLDEN = ROOT / "fixtures" / "golden"
NAMES = sorted(p.stem for p in FIXTURES.glob("*.json"))


@pytest.fixture(params=NAMES)
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_run(tmp_path: Path, name: str) -> Path:
    """A run directory like hvconform writes: results.json, evidence/, a plugin log, a ledger."""
    run = tmp_path / f"run-{name}"
    (run / "evidence").mkdir(parents=True)
    shutil.copy(FIXTURES / f"{name}.json", run / "results.json")
    for path in (FIXTURES / "evidence").iterdir():
        shutil.copy(path, run / "evidence" / path.name)
    (run / "plugin-main.log").write_text('{"level": "info", "event": "starting"}\n')
    (run / "ledger").mkdir()
    (run / "ledger" / "main.jsonl").write_text(
        '{"op": "created", "kind": "dir", "ident": "/tmp/hvn-x", "owner": "main", "detail": ""}\n'
        '{"op": "removed", "kind": "dir", "ident": "/tmp/hvn-x", "owner": "main", "detail": ""}\n'
    )
    return run / "results.json"


@pytest.fixture
def run_results(tmp_path: Path, name: str) -> Path:
    return make_run(tmp_path, name)
