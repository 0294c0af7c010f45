"""Issue 35, item 3 on the local target, live: each check's evidence covers only its own
window. cdi-missing makes this repository's plugin log `"cause": "missing"` repairs and
cdi-stale `"cause": "stale"` ones; each check's plugin log holds its own lines and never the
other's, and the kubelet emulator's records are cut to the check as well."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hvconform.contract.results import validate_results

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.kvm
def test_each_evidence_file_covers_only_its_checks_window(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "hvconform.cli", "run", "--out", str(out)]
    cmd += ["--reports-root", str(tmp_path), "--", "-k", "cdi-missing or cdi-stale"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    output = proc.stdout[-4000:] + proc.stderr[-2000:]
    data = json.loads((out / "results.json").read_text())
    validate_results(data)
    checks = {c["id"]: c for c in data["checks"]}
    assert checks["cdi-missing"]["status"] == checks["cdi-stale"]["status"] == "passed", output
    logs = {
        i: (out / "evidence" / f"{i}-plugin.log").read_text() for i in ("cdi-missing", "cdi-stale")
    }
    planted = {"cdi-missing": '"cause": "missing"', "cdi-stale": '"cause": "stale"'}
    for check, mine in planted.items():
        other = next(p for c, p in planted.items() if c != check)
        assert mine in logs[check], f"{check}'s own repair is not in its evidence"
        assert other not in logs[check], f"{check}'s evidence holds another check's lines"
        assert f"{check}-plugin.log" in checks[check]["evidence"]
        kubelet = (out / "evidence" / f"{check}-kubelet.log").read_text().splitlines()
        assert kubelet[0].startswith("# hvconform: the kubelet emulator's records")
        # cut to the window: no record from before the check started (negative offsets)
        assert all(line.startswith("+") for line in kubelet[1:]), kubelet
    # the report lists them in the order they ran, each with its start offset
    first, second = sorted(planted, key=lambda i: checks[i]["started_s"])
    report = (out / "report.md").read_text()
    assert report.index(f"(`{first}`) |") < report.index(f"(`{second}`) |")
    assert checks[first]["requirement_level"] == "MUST"
