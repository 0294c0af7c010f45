"""kind against RECORDED CONTRACTS: a node image that cannot be pulled blocks the run for want
of something (never 17 failed checks), and what the plugin pod runs is read back from the API
and held to the profile (a pod of another image fails the run, never passes it).

`kind create cluster` here prints what kind v0.2x/v0.3x prints when its node image is neither
on the machine nor pullable: "failed to pull image" wrapping the engine's reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.dra_profile import API_DEVICE_PLUGIN
from hvconform.contract.plugin import resolve
from hvconform.contract.preconditions import EXIT_ENVIRONMENT_BLOCKED
from hvconform.contract.results import EnvironmentBlocked, validate_results
from hvconform.scenarios import judging
from hvconform.suite import identity
from hvconform.targets.cluster.kind import OFFLINE_NODE_IMAGE, KindLifecycle
from hvconform.targets.cluster.run import open_cluster
from hvconform.targets.kindnode import NODE_IMAGE
from tests.targets.conftest import FakeMetadata, Recorded, contract_options, recorded_objects

REPO = Path(__file__).resolve().parents[2]
NO_SUCH_HOST = (
    'Creating cluster "hvconform" ...\n'
    " ✗ Ensuring node image (kindest/node:v1.31.0) 🖼\n"
    'ERROR: failed to create cluster: failed to pull image "kindest/node:v1.31.0": command '
    '"docker pull kindest/node:v1.31.0" failed with error: exit status 1\n'
    'Command Output: Error response from daemon: Get "https://registry-1.docker.io/v2/": dial '
    "tcp: lookup registry-1.docker.io on 127.0.0.53:53: no such host\n"
)
UNPULLABLE = {"kind": [{"match": r"^create cluster", "rc": 1, "stderr": NO_SUCH_HOST}]}


def test_the_offline_node_image_is_the_one_kind_image_builds() -> None:
    assert OFFLINE_NODE_IMAGE == NODE_IMAGE


@pytest.mark.parametrize("recorded", [("kind", UNPULLABLE)], indirect=True)
def test_an_unpullable_node_image_is_environment_blocked(recorded: Recorded) -> None:
    options = contract_options("kind", recorded.tmp)
    objects = recorded_objects(options.plugin_namespace)
    out = recorded.tmp / "out"
    lifecycle = KindLifecycle(options.validate(), objects, metadata=FakeMetadata())
    with pytest.raises(EnvironmentBlocked) as caught, open_cluster(lifecycle, out_dir=out):
        pytest.fail("kind create should have failed")
    line = str(caught.value)
    assert "\n" not in line and "no such host" in line and "kindest/node:v1.31.0" in line
    assert line.endswith(
        f"fix: build one offline: nox -s kind-image, then --node-image {OFFLINE_NODE_IMAGE}"
    )
    kind = recorded.commands("kind")
    assert not [c for c in kind if c.startswith("export logs")], "no node: nothing to export"
    assert any(c.startswith("delete cluster") for c in kind), "the armed delete still ran"
    data = json.loads((out / "cluster-kind.json").read_text())
    create = next(s for s in data["steps"] if s["id"] == "kind-create")
    assert create["status"] == "failed" and create["error"].startswith("EnvironmentBlocked: ")
    assert data["cleanup_ok"]


@pytest.mark.parametrize("recorded", [("kind", {})], indirect=True)
@pytest.mark.parametrize(
    ("deployed", "profile", "wrong"),
    [
        ("hv-device-plugin:0.1.0", "hv-device-plugin:0.1.0", ""),
        ("evil/plugin:6.6.6", "hv-device-plugin:0.1.0", "ran image evil/plugin:6.6.6"),
        ("hv-device-plugin@sha256:" + "a" * 64, "hv-device-plugin@sha256:" + "a" * 64, ""),
        ("hv-device-plugin@sha256:" + "b" * 64, "hv-device-plugin@sha256:" + "a" * 64, "ran"),
    ],
    ids=["same-tag", "other-image", "same-digest", "other-digest"],
)
def test_the_pod_that_ran_is_held_to_the_profile(
    recorded: Recorded, deployed: str, profile: str, wrong: str
) -> None:
    """The objects deploy `deployed`; the profile says `profile`: the read-back from the pod
    (spec image, the kubelet's imageID) decides, and a pod of another image fails the check."""
    plugin = resolve().with_image(profile)
    options = contract_options("kind", recorded.tmp, image=deployed)
    objects = recorded_objects(options.plugin_namespace, image=deployed)
    out = recorded.tmp / "out"
    lifecycle = KindLifecycle(options.validate(), objects, metadata=FakeMetadata(), plugin=plugin)
    outcome = identity.NodeOutcome(out, "main", "kind")
    with open_cluster(lifecycle, out_dir=out) as node:
        outcome.came_up(node)
        outcome.read(node, "end")
    reads = identity.plugin_ran(out)
    assert [r["phase"] for r in reads] == ["setup", "end"]
    (read,) = {json.dumps({**r, "phase": ""}, sort_keys=True) for r in reads}
    ran: dict[str, Any] = json.loads(read)
    assert ran["how"] == "pod" and ran["image"] == deployed
    assert ran["where"].startswith(f"{options.plugin_namespace}/")
    assert ran["image_id"].endswith(deployed.partition("@")[2]) and "@sha256:" in ran["image_id"]
    record = identity.record(out, plugin)
    assert record is not None
    if wrong:
        assert record["status"] == "failed", record
        assert record["reason"].startswith("the plugin that ran is not the profile's: ")
        assert wrong in record["reason"]
    else:
        assert record["status"] == "passed", record
        assert record["metrics"] == {"nodes": 1, "read_backs": 2}


def _stand_ins(bin_dir: Path, log: Path) -> None:
    """kind and docker as a machine without the node image has them (stand-ins, logged)."""
    bin_dir.mkdir()
    (bin_dir / "create.stderr").write_text(NO_SUCH_HOST)
    kind = f"""#!/bin/sh
echo "kind $*" >> '{log}'
case "$1" in
  version) echo "kind v0.33.0 go1.24.4 linux/amd64" ;;
  create) cat '{bin_dir / "create.stderr"}' >&2; exit 1 ;;
  get) echo "No kind clusters found." >&2 ;;
  delete) echo "Deleting cluster hvconform ..." >&2 ;;
  *) echo "unexpected: kind $*" >&2; exit 97 ;;
esac
"""
    docker = f"""#!/bin/sh
echo "docker $*" >> '{log}'
case "$1" in
  version) echo "28.2.2" ;;
  ps) ;;
  *) echo "unexpected: docker $*" >&2; exit 97 ;;
esac
"""
    for name, body in (("kind", kind), ("docker", docker)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)


def test_a_kind_run_without_its_node_image_is_environment_blocked(tmp_path: Path) -> None:
    """`hvconform run --target kind` where kind cannot pull its node image: exit 6, every check
    (the session-level ones too) environment_blocked with the same one line, none failed."""
    log = tmp_path / "commands.log"
    _stand_ins(tmp_path / "bin", log)
    out = tmp_path / "run"
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("HV_KIND_NODE_IMAGE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "hvconform.cli", "run", "--target", "kind", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO, env=env, check=False,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_ENVIRONMENT_BLOCKED, output[-3000:]
    data = json.loads((out / "results.json").read_text())
    validate_results(data)
    # every check judging a device plugin (this repository's plugin is one)
    judged = {c.id for c in judging(API_DEVICE_PLUGIN)}
    every = judged | {"metadata-two-phase", "plugin-identity", "cleanup"}
    assert {c["id"] for c in data["checks"]} == every, output[-2000:]
    assert {c["status"] for c in data["checks"]} == {"environment_blocked"}, data["checks"]
    (line,) = {c["reason"] for c in data["checks"]}
    assert "no such host" in line and line.endswith(f"--node-image {OFFLINE_NODE_IMAGE}")
    assert data["run"]["exit_code"] == EXIT_ENVIRONMENT_BLOCKED
    assert data["run"]["plugin_ran"] == [], "no plugin ran: nothing is named as having run"
    printed = [ln for ln in output.splitlines() if ln.startswith("hvconform: environment blocked")]
    assert printed == [f"hvconform: environment blocked, no check ran: {line}"], printed
    assert "kind delete cluster" in log.read_text() and "kind export" not in log.read_text()
    assert "ENVIRONMENT BLOCKED" in (out / "report.md").read_text()
