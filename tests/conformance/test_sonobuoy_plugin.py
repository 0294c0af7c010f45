"""Issue 39: the Sonobuoy plugin definition, the node pod's run and the manual-format results.

What Sonobuoy reads is checked against its own post-processing rules (result-format manual,
result-files by name, one item per check); the node pod's results come from a real local run of
the validate subset, never from hand-written JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from hvconform.scenarios import CATALOGUE, VALIDATE_MARK
from hvconform.sonobuoy import node as node_entry
from hvconform.sonobuoy.plugin import definition
from hvconform.sonobuoy.results import MANUAL_FILE, manual_tree, overall

IMAGE = "hvconform:0.1.0-abc"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hvconform.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_validate_subset_is_a_field_of_each_row_and_reads_only() -> None:
    subset = [c.id for c in CATALOGUE if c.validate]
    assert subset == ["validate-device", "validate-cdi-spec", "validate-guest", "validate-metadata"]
    # every fault check stays out of it: a row that injects a fault is never in the subset
    assert not any(c.validate for c in CATALOGUE if c.marker not in (VALIDATE_MARK,))


def test_the_plugin_is_a_daemonset_driver_with_the_host_access_declared_once() -> None:
    plugin = definition(image=IMAGE, deployed="kube-system/hv-device-plugin")
    config = plugin["sonobuoy-config"]
    assert config["driver"] == "DaemonSet"
    assert config["result-format"] == "manual" and config["result-files"] == [MANUAL_FILE]
    pod, spec = plugin["podSpec"], plugin["spec"]
    assert pod["hostPID"] is True and "hostNetwork" not in pod
    assert "volumes" not in pod, "Sonobuoy adds its results volume itself (a second one clashes)"
    assert spec["securityContext"] == {"privileged": True}
    assert spec["imagePullPolicy"] == "IfNotPresent"
    assert spec["args"][:3] == ["sonobuoy-node", "--mode", "validate"]
    assert spec["args"][3:5] == ["--deployed", "kube-system/hv-device-plugin"]
    assert {"name": "results", "mountPath": "/tmp/sonobuoy/results"} in spec["volumeMounts"]


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"image": "hvconform:latest"}, "--image"),
        ({"image": IMAGE, "mode": "full", "deployed": "ns/ds"}, "only with --mode validate"),
        ({"image": IMAGE, "deployed": "../etc"}, "NAMESPACE/DAEMONSET"),
        ({"image": IMAGE, "mode": "chaos"}, "--mode"),
    ],
)
def test_a_bad_plugin_input_is_refused(kw: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("-", r"\-")):
        definition(**kw)


def test_sonobuoy_plugin_prints_yaml_and_refuses_in_one_line() -> None:
    ok = _cli("sonobuoy-plugin", "--image", IMAGE, "--node-selector", "pool=kvm")
    assert ok.returncode == 0, ok.stderr
    assert yaml.safe_load(ok.stdout)["podSpec"]["nodeSelector"] == {"pool": "kvm"}
    bad = _cli("sonobuoy-plugin", "--image", IMAGE, "--mode", "full", "--deployed", "a/b")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "Traceback" not in bad.stderr


def test_statuses_keep_their_meaning_in_sonobuoy() -> None:
    assert overall(["passed", "not_applicable"]) == "passed"
    assert overall(["passed", "environment_blocked"]) == "environment_blocked"
    assert overall(["environment_blocked", "failed"]) == "failed"
    tree = manual_tree(
        {"run": {"mode": "validate"}, "checks": [
            {"id": "validate-guest", "status": "not_applicable", "reason": "no free slot"},
            {"id": "validate-device", "status": "failed", "reason": "allocatable 0",
             "metrics": {"capacity": 1}},
        ]},
        "node-a",
    )  # fmt: skip
    assert tree["status"] == "failed" and tree["meta"]["node"] == "node-a"
    guest, device = tree["items"]
    assert guest["status"] == "skipped" and guest["details"]["suite_status"] == "not_applicable"
    assert device["details"]["figures"] == {"capacity": 1}


@pytest.mark.root
@pytest.mark.kvm
def test_the_node_pods_files_are_what_sonobuoy_reads(tmp_path: Path) -> None:
    """A real run of the validate subset (local target) where the pod writes it; finish() then
    writes the manual YAML beside it and the done file naming the dir the worker sends."""
    results_dir = tmp_path / "results"
    run_dir = results_dir / node_entry.OUT / node_entry.RUN_DIR
    proc = _cli("run", "--mode", "validate", "--out", str(run_dir))
    assert (run_dir / "results.json").is_file(), proc.stdout[-2000:] + proc.stderr[-2000:]
    out = node_entry.finish(results_dir, "node-a")
    archive = Path((results_dir / "done").read_text())
    assert archive == results_dir / node_entry.ARCHIVE and archive.stat().st_mode & 0o777 == 0o644
    with tarfile.open(archive) as tar:  # what the worker sends: the out dir's files, relative
        names = tar.getnames()
    assert MANUAL_FILE in names and f"{node_entry.RUN_DIR}/results.json" in names, names
    tree = yaml.safe_load((out / MANUAL_FILE).read_text())
    results = json.loads((run_dir / "results.json").read_text())
    assert results["run"]["mode"] == "validate"
    assert [i["name"] for i in tree["items"]] == [c["id"] for c in results["checks"]]
    ran = {i["name"] for i in tree["items"]}
    assert {"validate-device", "validate-guest"} <= ran and "cdi-stale" not in ran
    assert tree["status"] == ("failed" if proc.returncode == 1 else "passed"), proc.stdout[-2000:]


def test_a_node_pod_without_results_says_why_to_sonobuoy(tmp_path: Path) -> None:
    out = node_entry.finish(tmp_path, "node-b", refused="no service account")
    tree = yaml.safe_load((out / MANUAL_FILE).read_text())
    # nothing verified there: blocked, never failed
    assert tree["status"] == "blocked" and tree["details"]["refused"] == "no service account"


def test_the_pods_kubeconfig_is_its_service_accounts(tmp_path: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("tok\n")
    (sa / "ca.crt").write_text("ca")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    path = node_entry.in_cluster_kubeconfig(tmp_path / "k" / "kubeconfig", env, sa)
    config = yaml.safe_load(path.read_text())
    assert config["clusters"][0]["cluster"]["server"] == "https://10.0.0.1:443"
    assert config["users"][0]["user"]["token"] == (sa / "token").read_text().strip()
    assert path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(RuntimeError, match="service account"):
        node_entry.in_cluster_kubeconfig(tmp_path / "x", {}, sa)


def test_the_node_pod_makes_one_run_of_the_cluster_target_from_its_own_pod() -> None:
    parser = __import__("argparse").ArgumentParser()
    node_entry.add_arguments(parser)
    ns = parser.parse_args(["--node", "n1", "--deployed", "kube-system/p", "--", "-m", "validate"])
    argv = node_entry.run_argv(ns, Path("/k"), Path("/o"))
    assert argv[argv.index("--node-access") + 1] == "host-pid"
    assert argv[argv.index("--mode") + 1] == "validate"
    assert argv[argv.index("--node") + 1] == "n1" and argv[-2:] == ["-m", "validate"]
