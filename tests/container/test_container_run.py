"""`--runtime container` end to end: the suite's guest check, and what results.json records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.contract.results import validate_results

pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "conformance" / "suite"


def test_guest_check_under_docker_and_podman(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "pytest", str(SUITE), "-c", str(SUITE / "pytest.ini"),
        "--rootdir", str(SUITE), "-p", "conformance.suite.pytest_plugin", "-p", "no:cacheprovider",
        "--runtime", "container", "--out", str(out), "-m", "guest", "-q",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    validate_results(data)
    assert data["run"]["runtime"] == "container"
    statuses = {c["id"]: c["status"] for c in data["checks"]}
    assert statuses["guest-execution"] == statuses["cleanup"] == "passed", statuses
    (target,) = data["environment"]["targets"].values()
    assert {"base", "plugin", "guest"} <= set(target["images"])
    assert all(i["id"].startswith("sha256:") for i in target["images"].values())
    for container in target["plugin_containers"]:
        assert container["CapEff"] == 0 and container["NoNewPrivs"] == 1
        assert container["image_id"] == target["images"]["plugin"]["id"]
    assert target["negative_control"]["exit"] != 0
    runs = [r for r in target["guest_runs"] if r["check"] == "guest-execution" and "value" in r]
    assert len(runs) == 6
    assert all(r["ok"] and r["cdi_devices"] == ["hyperlight.dev/hypervisor=kvm"] for r in runs)
    assert target["exec_probes"]["readiness"]["exit"] == 0
    assert target["cleanup_leftovers"] == []
