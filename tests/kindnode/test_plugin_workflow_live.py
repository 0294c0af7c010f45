"""Issue 36 LIVE: the reusable workflow's steps, for another repository's plugin, here.

`.github/workflows/hvconform-plugin.yml` is what a plugin's repository calls; each of its steps
is one phase of `.github/scripts/hvconform-kind.sh`. `hvconform-kind.sh all` runs those phases
with the workflow's `if:` rules, as separate processes as the steps are: the plugin's image into
the engine (here: go-kvm's, built offline, as "their" job would build it), the host /dev/kvm
snapshot, a KIND cluster on the offline node image (a runner pulls the stock kindest/node
pinned by digest instead), the startup metadata check, `hvconform run` with their profile, the
cluster deleted, the final metadata check, the summary.

go-kvm stands for another repository: its profile and manifests are copied to a temporary
directory outside this tree and the script runs from there, with nothing of this checkout on
the path but the installed suite (`hvconform`) and the script itself. What only a GitHub runner
does (artifact upload, the runner's own /dev/kvm, the pull of kindest/node) is not run here.
Run by `nox -s kind-live` (HV_KIND_LIVE=1; the engine fixture skips otherwise, with the reason).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.results import validate_results
from hvconform.targets.cluster import kindbin
from hvconform.targets.kindnode import NODE_IMAGE
from tests.fixture_plugins import GO_KVM_DIR
from tests.kindnode.live import ROOT
from tests.kindnode.live import kvm as _kvm

pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow, pytest.mark.timeout(2400)]
SCRIPT = ROOT / ".github" / "scripts" / "hvconform-kind.sh"


def their_repository(where: Path) -> Path:
    """go-kvm's profile and manifests, as its own repository would hold them."""
    shutil.copytree(GO_KVM_DIR / "deploy", where / "deploy")
    shutil.copy2(GO_KVM_DIR / "profile.yaml", where / "profile.yaml")
    return where / "profile.yaml"


def test_the_workflow_steps_certify_another_repositorys_plugin(
    tmp_path: Path, engine: dict[str, Any], go_kvm: str
) -> None:
    repo = tmp_path / "their-plugin"
    repo.mkdir()
    profile = their_repository(repo)
    assert not repo.resolve().is_relative_to(ROOT)
    summary, runner = tmp_path / "step-summary.md", tmp_path / "runner"
    summary.touch()
    runner.mkdir()
    cluster = f"hvwf-{os.getpid()}"
    base = kindbin.kind_env() or dict(os.environ)
    env = {
        **base,
        # the suite as installed (its console script beside this interpreter), then kind
        "PATH": f"{Path(sys.executable).parent}:{base['PATH']}",
        "DOCKER_HOST": engine["host"],
        "GITHUB_STEP_SUMMARY": str(summary),
        "RUNNER_TEMP": str(runner),
        "HV_GUEST_IMAGE": engine["tags"]["guest"],
        "HVCONFORM_REPORTS": str(repo / "reports"),
    }
    for var in ("PYTHONPATH", "VIRTUAL_ENV", "HV_CHART"):
        env.pop(var, None)
    before = _kvm()
    argv = ["bash", str(SCRIPT), "--node-image", NODE_IMAGE, "--cluster", cluster,
            "--image", go_kvm, "--profile", str(profile), "all"]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=2200, env=env, cwd=repo)
    seconds = time.monotonic() - t0
    print(f"hvconform-kind.sh all for go-kvm: {seconds:.0f} s")
    output = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, output

    # every phase ran, in the workflow's order, each exiting 0
    phases = ["image", "original", "create", "startup", "run", "delete", "final", "summary"]
    ran = [line.split()[1] for line in proc.stderr.splitlines()
           if line.startswith("hvconform-kind: ") and line.endswith(" exit 0")]  # fmt: skip
    assert ran == phases, output

    results = repo / "reports" / "latest" / "results.json"
    data: dict[str, Any] = json.loads(results.read_text())
    validate_results(data)
    assert data["run"]["plugin"]["name"] == "go-kvm"
    assert data["run"]["plugin"]["this_repository"] is False
    statuses = {c["id"]: c["status"] for c in data["checks"]}
    # judged, not waved through: a KIND run of go-kvm passes its checks; the ones a cluster it
    # did not create cannot apply say so (their reasons are in results.json), none failed
    assert set(statuses.values()) <= {"passed", "not_applicable"}, statuses
    assert sum(s == "passed" for s in statuses.values()) >= 10, statuses
    assert statuses["metadata-two-phase"] == "passed", statuses

    # the job summary: the metadata verdicts and the report's verdict table, as Markdown
    text = summary.read_text()
    assert "| Check |" in text and "go-kvm" in text, text[:2000]
    metadata = runner / "kvm-metadata"
    for snapshot in ("original", "startup", "validated", "final"):
        assert json.loads((metadata / f"{snapshot}.json").read_text()), snapshot
    assert _kvm() == before, "/dev/kvm metadata changed"
    # the cluster is gone: the engine holds what it held before the module (the fixture checks
    # containers and volumes at its end; the cluster's own containers are named after it)
    left = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"name={cluster}", "--format", "{{.Names}}"],
        capture_output=True, text=True, env=env, check=True,
    ).stdout.split()  # fmt: skip
    assert left == [], left
