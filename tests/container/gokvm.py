"""The go-kvm fixture plugin on `--runtime container`: its image, variant profiles, a run.

A variant is chosen where a cluster operator would choose it: in the plugin container's env of
its DaemonSet (GOKVM_DEFECT), so a variant profile is the fixture's profile with its manifests
replaced by a copy whose env differs in that one value (and its process-runtime env equal, so
the same profile selects the same variant on every runtime). Runs go through the CLI, as a user
runs them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from hvconform.contract.plugin import load_profile
from hvconform.contract.results import validate_results
from tests.fixture_plugins import GO_KVM_DIR

ROOT = Path(__file__).resolve().parents[2]
PROFILE = GO_KVM_DIR / "profile.yaml"
DEFECT = "GOKVM_DEFECT"
# The never-back-after-stream-lost mutant on a cluster target: what runs and what each check
# must end as (the checks after stream-lost blocked by it, never failed: issue 35).
NEVER_BACK_SELECTION = "cdi-missing or stream-lost or restart-plugin or restart-kubelet or rollout"
NEVER_BACK_VERDICTS = {
    "cdi-missing": "passed",  # before the stream is lost the mutant is fine
    "stream-lost": "failed",  # its own verdict
    "restart-plugin": "blocked",
    "restart-kubelet": "blocked",
    "rollout-safety": "blocked",
    "metadata-two-phase": "passed",
    "plugin-identity": "passed",
    "cleanup": "passed",
}


def variant_profile(tmp_path: Path, defect: str = "", base: Path = PROFILE) -> Path:
    """A profile of go-kvm (`base`: profile.yaml or profile-exec.yaml) with GOKVM_DEFECT=defect
    in its DaemonSet (and its process env)."""
    data = yaml.safe_load(base.read_text())
    profile = load_profile(base)
    assert profile.deploy is not None, f"{base} has no deploy section"
    manifests: dict[str, list[str]] = {}
    listed = [(key, path) for key, paths in profile.deploy.manifests.items() for path in paths]
    for i, (key, manifest) in enumerate(listed):
        objects = list(yaml.safe_load_all(Path(manifest).read_text()))
        for obj in objects:
            if obj.get("kind") != "DaemonSet":
                continue
            for container in obj["spec"]["template"]["spec"]["containers"]:
                if container["name"] == profile.deploy.pods.container:
                    env = [e for e in container.get("env", []) if e["name"] != DEFECT]
                    container["env"] = [*env, {"name": DEFECT, "value": defect}]
        out = tmp_path / f"manifest-{i}.yaml"
        out.write_text(yaml.safe_dump_all(objects))
        manifests.setdefault(key, []).append(str(out))
    data["deploy"]["manifests"] = manifests
    data["command"] = [str(GO_KVM_DIR / "bin" / "go-kvm"), *data["command"][1:]]
    for kind in ("readiness", "liveness"):  # exec probes name the binary too
        if data.get(kind, {}).get("type") == "exec":
            data[kind]["command"] = [str(GO_KVM_DIR / "bin" / "go-kvm"), *data[kind]["command"][1:]]
    data["env"] = {DEFECT: defect} if defect else {}
    variant = tmp_path / "profile.yaml"
    variant.write_text(yaml.safe_dump(data))
    load_profile(variant)  # the variant is itself a valid profile
    return variant


def run_container(
    tmp_path: Path, profile: Path | None, selection: str = "", recovery: str = "60"
) -> dict[str, Any]:
    """`hvconform run --runtime container` (the shipped profile when `profile` is None);
    results.json, validated, with the output tail under "_output"."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "hvconform.cli", "run", "--runtime", "container"]
    cmd += ["--out", str(out), "--reports-root", str(tmp_path), "--recovery-timeout", recovery]
    cmd += ["--plugin-profile", str(profile)] if profile else []
    cmd += ["-m", selection] if selection else []
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    results = out / "results.json"
    assert results.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(results.read_text())
    validate_results(data)
    data["_output"] = proc.stdout[-4000:] + proc.stderr[-2000:]
    data["_exit"] = proc.returncode
    return data


def statuses(data: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["status"] for c in data["checks"]}


def target_report(data: dict[str, Any]) -> dict[str, Any]:
    (report,) = data["environment"]["targets"].values()
    assert isinstance(report, dict)
    return report
