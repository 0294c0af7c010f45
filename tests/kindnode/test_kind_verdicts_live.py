"""Issue 35 on KIND, LIVE: verdicts that hold for plugins this repository did not write.

A real kind cluster per run (the offline node image, the kind engine), made and deleted by
`hvconform run --target kind`:
- health-after-kubelet-restart passes this repository's plugin and go-kvm and fails go-kvm's
  stale-stream-after-restart defect (old streams alive after a kubelet restart swallow health
  updates);
- go-kvm deployed with exec probes only (no HTTP port, an image holding only its binary:
  profile-exec.yaml) is never judged dead while the kubelet keeps its container running;
- a plugin that never recovers from stream-lost (go-kvm's never-back-after-stream-lost) leaves
  every later check `blocked`, never failed.
Run by `nox -s kind-live` (HV_KIND_LIVE=1; the engine fixture skips otherwise, with the reason).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.results import validate_results
from hvconform.targets.cluster import kindbin
from hvconform.targets.kindnode import NODE_IMAGE
from tests.container.gokvm import NEVER_BACK_SELECTION, NEVER_BACK_VERDICTS, variant_profile
from tests.fixture_plugins import GO_KVM_DIR
from tests.kindnode.live import ROOT, serial
from tests.kindnode.live import kvm as _kvm

pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow, pytest.mark.timeout(2400)]
EXEC_PROFILE = GO_KVM_DIR / "profile-exec.yaml"


@pytest.fixture(scope="module")
def go_kvm(engine: dict[str, Any]) -> str:
    """go-kvm's image (built offline from its binary) copied into the kind engine."""
    from hvconform.targets.container.engine import DockerEngine
    from hvconform.targets.kindnode.engine import copy_image
    from tests.container.fixture_image import ensure_in_engine
    from tests.fixture_plugins import build_go_kvm

    build_go_kvm()
    with DockerEngine(what="tests/kindnode go-kvm") as suite_engine:
        tag = ensure_in_engine(suite_engine).tag
        copy_image(tag, suite_engine, engine["engine"])
    return tag


def _run(engine: dict[str, Any], out: Path, *extra: str) -> dict[str, Any]:
    kvm = _kvm()
    argv = [
        sys.executable, "-m", "hvconform.cli", "run", "--target", "kind",
        "--cluster-name", f"hvt-{os.getpid()}-{next(serial)}", "--node-image", NODE_IMAGE,
        "--guest-image", engine["tags"]["guest"], "--out", str(out), *extra,
    ]  # fmt: skip
    env = dict(kindbin.kind_env() or os.environ, DOCKER_HOST=engine["host"])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=2200, env=env, cwd=ROOT)
    results = out / "results.json"
    assert results.exists(), proc.stdout[-3000:] + proc.stderr[-2000:]
    data: dict[str, Any] = json.loads(results.read_text())
    validate_results(data)
    data["_output"] = proc.stdout[-4000:]
    report = json.loads((out / "cluster-kind.json").read_text())
    assert report["cleanup_ok"], report["verification"]
    assert _kvm() == kvm, "/dev/kvm metadata changed"
    return data


def _statuses(data: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["status"] for c in data["checks"]}


@pytest.mark.parametrize("plugin", ["ours", "go-kvm", "go-kvm stale-stream-after-restart"])
def test_health_after_kubelet_restart(
    plugin: str, tmp_path: Path, engine: dict[str, Any], go_kvm: str
) -> None:
    if plugin == "ours":
        profile = ["--image", engine["tags"]["plugin"]]
    else:
        defect = plugin.partition(" ")[2]
        profile = ["--plugin-profile", str(variant_profile(tmp_path, defect))]
    data = _run(engine, tmp_path / "out", *profile, "--", "-k", "health-after-kubelet-restart")
    got = _statuses(data)["health-after-kubelet-restart"]
    assert got == ("failed" if "stale" in plugin else "passed"), data["_output"]


def test_exec_probe_plugin_is_never_judged_dead(
    tmp_path: Path, engine: dict[str, Any], go_kvm: str
) -> None:
    data = _run(engine, tmp_path / "out", "--plugin-profile", str(EXEC_PROFILE))
    failed = {c["id"]: c["reason"] for c in data["checks"] if c["status"] == "failed"}
    assert not failed, data["_output"]
    notes = [n for c in data["checks"] for n in c.get("notes", []) if "liveness" in n]
    assert not notes, notes
    passed = {i for i, s in _statuses(data).items() if s == "passed"}
    assert {"cdi-missing", "registration-failure", "registration-dir-replaced", "stream-lost",
            "restart-kubelet"} <= passed, data["_output"]  # fmt: skip


def test_a_plugin_that_never_recovers_leaves_the_rest_blocked(
    tmp_path: Path, engine: dict[str, Any], go_kvm: str
) -> None:
    profile = variant_profile(tmp_path, "never-back-after-stream-lost", base=EXEC_PROFILE)
    data = _run(engine, tmp_path / "out", "--plugin-profile", str(profile),
                "--recovery-timeout", "20", "--", "-k", NEVER_BACK_SELECTION)  # fmt: skip
    assert _statuses(data) == NEVER_BACK_VERDICTS, data["_output"]
    for check in data["checks"]:
        if check["status"] == "blocked":
            assert "stream-lost left the node dirty" in check["reason"], check["reason"]
