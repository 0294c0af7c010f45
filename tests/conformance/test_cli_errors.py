"""hvconform on careless and hostile input: exit 2, one line on stderr, no traceback, nothing written.

Every case runs the real command line (`python -m hvconform.cli`) in a child process, so what
is asserted is exactly what a person at a terminal sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvconform.metadata.rules import dump_snapshot, snapshot
from tests.report.conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[2]
DEEP = "[" * 100_000 + "]" * 100_000


def hvconform(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HV_")}
    return subprocess.run(
        [sys.executable, "-m", "hvconform.cli", *args],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def results_with(tmp_path: Path, name: str, change: str) -> Path:
    """A copy of a valid results.json whose run duration is `change`, written as it is (NaN and
    Infinity are what JSON cannot hold, so they are spliced into the text)."""
    data = json.loads((FIXTURES / "all-passed.json").read_text())
    data["run"]["duration_s"] = "@DURATION@"
    run = tmp_path / name
    run.mkdir()
    (run / "results.json").write_text(json.dumps(data).replace('"@DURATION@"', change))
    return run / "results.json"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    made = {
        "deep": tmp_path / "deep.json",
        "binary": tmp_path / "binary.bin",
        "a_file": tmp_path / "a_file",
        "not_empty": tmp_path / "not_empty",
        "good_snapshot": tmp_path / "original.json",
        "nan_bench": tmp_path / "nan-bench.json",
        "shapeless_bench": tmp_path / "shapeless-bench.json",
    }
    made["deep"].write_text(DEEP)
    made["binary"].write_bytes(bytes(range(256)) * 64)
    made["a_file"].write_text("not a directory\n")
    made["not_empty"].mkdir()
    (made["not_empty"] / "id_rsa").write_text("a key someone keeps here\n")
    made["good_snapshot"].write_text(dump_snapshot(snapshot("/dev/kvm")))
    made["nan_bench"].write_text('{"schema": "hvconform-bench/1", "figures": [], "x": NaN}')
    made["shapeless_bench"].write_text(
        json.dumps({"schema": "hvconform-bench/1", "machine": {}, "figures": [{"key": 1}]})
    )
    for kind, change in (
        ("good", "14.215"),
        ("nan", "NaN"),
        ("infinity", "Infinity"),
        ("overflow", "1e400"),
    ):
        made[kind] = results_with(tmp_path, kind, change)
    return made


# (case id, argv with {placeholders} for the files above, a word the one line must contain)
CASES = [
    ("report-deep", ["report", "{deep}"], "nested deeper"),
    ("report-nan", ["report", "{nan}"], "NaN"),
    ("report-infinity", ["report", "{infinity}"], "Infinity"),
    ("report-overflow", ["report", "{overflow}"], "finite"),
    ("report-binary", ["report", "{binary}"], "binary"),
    ("report-directory", ["report", "{not_empty}"], "not a regular file"),
    ("report-missing", ["report", "{tmp}/missing.json"], "No such file"),
    ("report-out-is-a-file", ["report", "{good}", "--out", "{a_file}"], "not a directory"),
    ("check-startup-deep", ["metadata", "check-startup", "--original", "{good_snapshot}",
                            "--current", "{deep}", "--node-kvm-gid", "36"], "nested deeper"),
    ("check-final-binary", ["metadata", "check-final", "--original", "{good_snapshot}",
                            "--current", "{binary}"], "binary"),
    ("snapshot-out-dir", ["metadata", "snapshot", "--out", "{not_empty}"], "Is a directory"),
    ("run-out-file", ["run", "--out", "{a_file}"], "not a directory"),
    ("run-out-not-empty", ["run", "--out", "{not_empty}"], "not empty"),
    ("run-out-under-file", ["run", "--out", "{a_file}/run"], "is not a directory"),
    ("run-reports-root-file", ["run", "--reports-root", "{a_file}"], "not a directory"),
    ("run-marker-syntax", ["run", "--reports-root", "{tmp}/reports", "-m", "cdi or"],
     "not a marker expression"),
    ("run-unknown-marker", ["run", "--reports-root", "{tmp}/reports", "-m", "nosuch"],
     "unknown marker"),
    ("run-recovery-nan", ["run", "--recovery-timeout", "nan"], "--recovery-timeout"),
    ("run-workers", ["run", "-n", "lots"], "-n 'lots'"),
    ("run-unknown-flag", ["run", "--no-such-flag"], "unrecognized arguments"),
    ("bench-compare-binary", ["bench", "--compare", "{binary}"], "binary"),
    ("bench-compare-deep", ["bench", "--compare", "{deep}"], "nested deeper"),
    ("bench-compare-nan", ["bench", "--compare", "{nan_bench}"], "NaN"),
    ("bench-compare-shapeless", ["bench", "--compare", "{shapeless_bench}"], "key"),
    ("bench-out-file", ["bench", "--out", "{a_file}"], "not a directory"),
    ("manifests-target", ["manifests", "--target", "nosuch"], "invalid choice"),
    ("no-command", [], "required"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "word"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, files: dict[str, Path], argv: list[str], word: str
) -> None:
    names = {k: str(v) for k, v in files.items()} | {"tmp": str(tmp_path)}
    args = [a.format(**names) for a in argv]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    proc = hvconform(*args, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert len(lines) == 1, proc.stderr
    assert word in lines[0], lines[0]
    # Nothing written: no report next to bad results, no run dir, no snapshot.
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_marker_syntax_error_leaves_latest_untouched(tmp_path: Path) -> None:
    root = tmp_path / "reports"
    (root / "20260101T000000Z-1").mkdir(parents=True)
    (root / "latest").symlink_to("20260101T000000Z-1")
    proc = hvconform("run", "--reports-root", str(root), "-m", "cdi or")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
    assert (root / "latest").readlink() == Path("20260101T000000Z-1")
    assert sorted(p.name for p in root.iterdir()) == ["20260101T000000Z-1", "latest"]


def test_version_names_version_and_commit() -> None:
    from hv_device_plugin.api.names import installed_version

    proc = hvconform("--version")
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert line.startswith(f"hvconform {installed_version()} (commit ")
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert head in line
