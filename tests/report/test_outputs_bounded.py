"""Output files and the cost of `compare` (issue 27): a symlink planted where a report's
temporary file used to go is never followed, and a comparison of huge inputs stays bounded in
time, memory and output, saying what it left out."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvconform.contract.safewrite import write_atomic
from tests.report.conftest import FIXTURES

PAIR = FIXTURES / "compare"
HVCONFORM = [sys.executable, "-m", "hvconform.cli"]


def test_a_planted_symlink_is_replaced_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("report.md", "report.md.tmp", ".report.md.tmp"):
        (out / name).symlink_to(victim)
    write_atomic(out / "report.md", "new report")
    assert victim.read_text() == "precious"
    assert not (out / "report.md").is_symlink() and (out / "report.md").read_text() == "new report"


def test_compare_into_a_directory_with_planted_symlinks_leaves_their_targets(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "cmp"
    out.mkdir()
    for name in ("compare.md.tmp", "compare.html.tmp", "compare.md", "compare.html"):
        (out / name).symlink_to(victim)
    proc = subprocess.run(
        [*HVCONFORM, "compare", str(PAIR / "ours"), str(PAIR / "go-kvm"), "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    assert victim.read_text() == "precious"
    assert not (out / "compare.md").is_symlink()


def _with_metrics(src: Path, dest: Path, count: int) -> Path:
    data = json.loads((src / "results.json").read_text())
    metrics = {f"m{i}_s": i / 1000 for i in range(count)}
    data["checks"][0]["metrics"] = metrics
    dest.mkdir()
    (dest / "results.json").write_text(json.dumps(data))
    return dest


@pytest.mark.parametrize("count", [40_000, 400_000])  # truncated; refused (MAX_RESULTS_VALUES)
def test_compare_of_huge_inputs_is_bounded_and_says_what_it_left_out(
    tmp_path: Path, count: int
) -> None:
    a = _with_metrics(PAIR / "ours", tmp_path / "a", count)
    b = _with_metrics(PAIR / "go-kvm", tmp_path / "b", count)
    out = tmp_path / "out"
    t0 = time.monotonic()
    proc = subprocess.run(
        [*HVCONFORM, "compare", str(a), str(b), "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    seconds = time.monotonic() - t0
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    assert proc.returncode in (0, 1, 2), proc.stderr
    if proc.returncode == 2:  # refused as too large: one line, nothing written
        assert len(proc.stderr.splitlines()) == 1 and not out.exists()
        return
    written = sum(p.stat().st_size for p in out.iterdir())
    print(f"compare of {count} metrics: {seconds:.1f} s, peak {peak_mib:.0f} MiB, {written} B")
    markdown = (out / "compare.md").read_text()
    assert "more figures not shown" in markdown
    assert written < 5 * 1024 * 1024, "the output grew with the input"
