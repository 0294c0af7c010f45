"""The suite judging a plugin it has never seen: the Go fixture (k8s.io/kubelet v1beta1, fixed
standard paths, gRPC Health, its own resource and CDI kind), unmodified, through its profile.

Each defect variant (switched by GOKVM_DEFECT) must change exactly the verdicts it should; a
variant that leaves the node dirty blocks the checks after it (never fails them) and the run
still ends with cleanup passed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hvconform.contract.plugin import load_profile
from hvconform.contract.results import validate_results
from tests.fixture_plugins import build_go_kvm

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "fixtures" / "plugins" / "go-kvm" / "profile.yaml"
CDI = ["cdi-missing", "cdi-stale", "cdi-malformed", "cdi-non-regular", "cdi-read-only"]
SELECTION = ""  # every check
# The local target deploys no DaemonSet: the rollout check never applies there.
NO_ROLLOUT = {"rollout-safety": "not_applicable"}


def _variant(tmp_path: Path, env: dict[str, str], readiness: str = "") -> Path:
    """A profile for one variant: the shipped fixture profile with env (and probes) changed."""
    build_go_kvm()
    data = yaml.safe_load(PROFILE.read_text())
    data["command"] = [str(PROFILE.parent / "bin" / "go-kvm"), "-v=2"]
    data["env"] = env
    data.pop("deploy", None)  # its files are relative to the fixture's dir; a process runs here
    if readiness == "none":
        # two objects: one shared would be dumped as a YAML alias, which profiles refuse
        data["readiness"], data["liveness"] = {"type": "none"}, {"type": "none"}
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    load_profile(path)  # the variant is itself a valid profile
    return path


def _run(tmp_path: Path, profile: Path, selection: str, recovery: str = "60") -> dict[str, Any]:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "hvconform.cli", "run", "--out", str(out)]
    cmd += ["--reports-root", str(tmp_path), "--plugin-profile", str(profile)]
    # A defect variant never recovers from some faults: its runs bound each of those waits (as
    # the mutant tests do); the others keep the default, so a loaded machine cannot fail them.
    cmd += ["--recovery-timeout", recovery]
    cmd += ["-m", selection] if selection else []
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    results = out / "results.json"
    assert results.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(results.read_text())
    validate_results(data)
    data["_output"] = proc.stdout[-4000:] + proc.stderr[-2000:]
    return data


def _statuses(data: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["status"] for c in data["checks"]}


def _expect(data: dict[str, Any], want: dict[str, str], default: str = "passed") -> None:
    got = _statuses(data)
    want = {**NO_ROLLOUT, **want}
    expected = {check: want.get(check, default) for check in got}
    assert got == expected, data["_output"]


@pytest.mark.kvm
def test_correct_variant_passes_every_check(tmp_path: Path) -> None:
    data = _run(tmp_path, _variant(tmp_path, {}), SELECTION)
    # It declares no optional RPC (GetDevicePluginOptions is empty): that check does not apply.
    _expect(data, {"optional-rpcs": "not_applicable"})
    assert data["run"]["plugin"]["name"] == "go-kvm"
    assert data["run"]["plugin"]["readiness"] == "grpc-health"
    by_id = {c["id"]: c for c in data["checks"]}
    assert by_id["cdi-missing"]["metrics"]["recovery_s"] > 0


@pytest.mark.kvm
def test_a_plugin_that_never_repairs_fails_exactly_the_repair_checks(tmp_path: Path) -> None:
    data = _run(
        tmp_path, _variant(tmp_path, {"GOKVM_DEFECT": "no-cdi-repair"}), "cdi", recovery="10"
    )
    # Read-only storage and the obstruction are reported unhealthy by the variant's own start-up
    # check only after a restart; the repair itself is what the first three checks measure.
    got = _statuses(data)
    for check in ("cdi-missing", "cdi-stale", "cdi-malformed"):
        assert got[check] == "failed", data["_output"]
    assert got["cleanup"] == "passed"
    assert "blocked" not in got.values(), data["_output"]


@pytest.mark.kvm
def test_a_plugin_that_never_probes_fails_exactly_the_usability_check(tmp_path: Path) -> None:
    data = _run(
        tmp_path, _variant(tmp_path, {"GOKVM_DEFECT": "no-probe"}), "identity", recovery="10"
    )
    got = _statuses(data)
    assert got["device-unusable"] == "failed", data["_output"]
    assert got["cleanup"] == "passed"


@pytest.mark.kvm
def test_a_plugin_that_ignores_its_lost_stream_fails_exactly_stream_lost(tmp_path: Path) -> None:
    """Issue 26: the kubelet ends the ListAndWatch stream (and disconnects the endpoint); a
    plugin that never registers again fails stream-lost and nothing else of its marker set."""
    variant = _variant(tmp_path, {"GOKVM_DEFECT": "no-stream-reregister"})
    data = _run(tmp_path, variant, "registration or workloads", recovery="10")
    _expect(data, {"stream-lost": "failed"})


@pytest.mark.kvm
def test_slow_reregistration_passes_and_shows_the_delay(tmp_path: Path) -> None:
    data = _run(tmp_path, _variant(tmp_path, {"GOKVM_DEFECT": "slow-reregister"}), "restart")
    _expect(data, {})
    by_id = {c["id"]: c for c in data["checks"]}
    assert 4.5 < by_id["restart-kubelet"]["metrics"]["reregistration_s"] < 15


@pytest.mark.kvm
def test_no_readiness_is_judged_on_the_kubelet_view_never_falsely_failed(tmp_path: Path) -> None:
    profile = _variant(tmp_path, {"GOKVM_DEFECT": "no-health"}, readiness="none")
    data = _run(tmp_path, profile, "cdi or registration")
    _expect(data, {})
    notes = [n for c in data["checks"] for n in c.get("notes", [])]
    assert any("readiness not observable" in n for n in notes), notes


@pytest.mark.kvm
def test_a_dirty_node_blocks_the_rest_and_cleanup_still_passes(tmp_path: Path) -> None:
    data = _run(
        tmp_path, _variant(tmp_path, {"GOKVM_DEFECT": "dirty-obstruction"}), "cdi", recovery="10"
    )
    got = _statuses(data)
    assert got["cdi-non-regular"] == "failed", data["_output"]
    assert got["cdi-read-only"] == "blocked", data["_output"]
    blocked = next(c for c in data["checks"] if c["id"] == "cdi-read-only")
    assert "cdi-non-regular left the node dirty" in blocked["reason"]
    assert got["cleanup"] == "passed", data["_output"]
