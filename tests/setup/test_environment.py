"""The environment each target family reports: every version is what the program itself says.

The real node's components are asked from the binaries of `nox -s node-build` (stand-ins here
that answer as the real ones do, in a bin dir of the test's own) and from the host's containerd
and runc (real); the container runtime's from the real dockerd, podman and crun; a cluster's from
its API server and Node objects (the recorded-contract API stand-in). Then the rows both reports
make of them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.preconditions import version_of
from hvconform.report.env_facts import rows
from hvconform.targets import preflight
from hvconform.targets.cluster.kube import KubeApi
from hvconform.targets.cluster.preflight import cluster_facts
from hvconform.targets.realnode import preflight as node_preflight
from tests.setup.support import standin
from tests.targets.fake_kube import FakeKube
from tests.targets.fakes import CONTRACTS, load_rules

# What each real binary prints for --version (kubelet and kube-apiserver share component-base).
ANSWERS = {
    "kubelet": "Kubernetes v1.37.2",
    "kube-apiserver": "Kubernetes v1.37.2",
    "etcd": "etcd Version: 3.7.3\nGit SHA: GitNotFound\nGo Version: go1.26.8\nGo OS/Arch: linux/amd64",
    "crictl": "crictl version v1.37.0",
}


def first_line(argv: list[str]) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return (res.stdout + res.stderr).strip().splitlines()[0]


def test_node_components_are_asked_from_the_binaries(tmp_path: Path) -> None:
    for name, answer in ANSWERS.items():
        standin(tmp_path, name, answer)
    env = node_preflight.environment(bin_dir=tmp_path)
    components = env["components"]
    for name in ANSWERS:
        asked = first_line([str(tmp_path / name), "--version"])
        assert components[name]["output"] == asked
        assert components[name]["version"] == asked.split()[-1]  # v1.37.2, 3.7.3, v1.37.0
        assert components[name]["command"] == f"{tmp_path / name} --version"
    # The host's own containerd and runc, whatever their versions are on this machine.
    containerd = first_line(["containerd", "--version"])
    assert components["containerd"]["version"] == containerd.split()[2].lstrip("v")
    assert components["runc"]["version"] == first_line(["runc", "--version"]).split()[2]
    assert env["cgroup_driver"] == "cgroupfs"  # the kubelet's configuration says so


def test_a_binary_that_does_not_know_its_version_is_read_from_its_build_info(
    tmp_path: Path,
) -> None:
    """crictl from `go install` prints "crictl version unknown" (its version is an ldflag): the
    version is then its main module's, from the build info Go embeds in the binary. A real Go
    build of a module with crictl's path stands in (a local build's version is "(devel)")."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "go.mod").write_text("module sigs.k8s.io/cri-tools\n\ngo 1.21\n")
    (src / "main.go").write_text(
        'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("crictl version unknown") }\n'
    )
    bin_dir = tmp_path / "bin"
    subprocess.run(["go", "build", "-o", str(bin_dir / "crictl"), "."], cwd=src, check=True,
                   timeout=300, capture_output=True, env={**os.environ, "GOFLAGS": "-mod=mod"})  # fmt: skip
    assert first_line([str(bin_dir / "crictl"), "--version"]) == "crictl version unknown"
    got = node_preflight.binary_version("crictl", bin_dir)
    assert got == {
        "version": "(devel)",
        "command": f"go version -m {bin_dir / 'crictl'}",
        "output": "mod sigs.k8s.io/cri-tools (devel)",
    }
    finding = node_preflight.built("crictl", bin_dir).check()
    assert not finding.ok and finding.found == "(devel)"


def test_a_binary_that_is_not_there_is_unavailable(tmp_path: Path) -> None:
    env = node_preflight.environment(bin_dir=tmp_path)
    assert env["components"]["kubelet"] == {
        "version": "unavailable",
        "command": f"{tmp_path / 'kubelet'} --version",
    }


def test_container_runtime_versions_are_the_programs_own() -> None:
    components = preflight("local", "container").environment("local", "container")["components"]
    dockerd = first_line(["dockerd", "--version"])  # Docker version 20.10.24+dfsg1, build ...
    assert components["docker engine"]["version"] == dockerd.split()[2].rstrip(",")
    assert components["podman"]["version"] == first_line(["podman", "--version"]).split()[-1]
    assert components["crun"]["version"] == first_line(["crun", "--version"]).split()[-1]


def test_local_components() -> None:
    components = preflight("local").environment("local", "process")["components"]
    mount = first_line(["mount", "--version"])
    assert components["util-linux"]["version"] == re.search(r"util-linux (\S+)", mount)[1]  # type: ignore[index]
    python = components["workload python"]["command"].split()[0]
    assert components["workload python"]["version"] == first_line([python, "--version"]).split()[1]


@pytest.fixture
def kube(tmp_path: Path) -> Any:
    data = json.loads((CONTRACTS / "kube.json").read_text())
    with FakeKube({**data["kind"], "logs": data["logs"]}, load_rules("kind")) as fake:
        fake.state.objects["/version"] = {"gitVersion": "v1.35.7", "metadata": {}}
        api = KubeApi(str(fake.kubeconfig(tmp_path / "kubeconfig")))
        yield api, data["kind"]["nodes"]
        api.close()


def test_cluster_facts_come_from_the_node_objects(kube: Any) -> None:
    api, nodes = kube
    facts = cluster_facts(api)
    assert facts["server_version"] == "v1.35.7"
    want = [
        {
            "name": n["metadata"]["name"],
            "kubelet": n["status"]["nodeInfo"]["kubeletVersion"],
            "container_runtime": n["status"]["nodeInfo"]["containerRuntimeVersion"],
            "os_image": n["status"]["nodeInfo"]["osImage"],
            "kernel": n["status"]["nodeInfo"]["kernelVersion"],
        }
        for n in nodes
    ]
    assert facts["nodes"] == want and want
    labels = dict(rows({"cluster": facts}))
    node = want[0]
    assert labels["Cluster API server"] == "v1.35.7"
    assert labels[f"Cluster node {node['name']}"] == (
        f"kubelet {node['kubelet']}, runtime {node['container_runtime']}, "
        f"OS image {node['os_image']}, kernel {node['kernel']}"
    )


def test_report_rows_name_every_component_and_the_unmet_precondition() -> None:
    env = {
        "cgroup": {"version": "hybrid", "driver": "cgroupfs", "controllers": "cpu,memory"},
        "suite_version": "0.1.0",
        "components": {"containerd": version_of(["containerd", "--version"], r"containerd\s+\S+\s+v?(\S+)")},
        "preconditions": [
            {"component": "root", "need": "uid 0", "found": "uid 0", "ok": True},
            {"component": "containerd", "need": ">= 1.7", "found": "1.6.20", "ok": False,
             "fix": "nox -s node-deps"},
        ],
    }  # fmt: skip
    got = dict(rows(env))
    assert got["Cgroups"] == "hybrid, driver cgroupfs (controllers cpu,memory)"
    assert got["Suite"] == "hvconform 0.1.0"
    assert got["containerd"].startswith(env["components"]["containerd"]["version"])  # type: ignore[index]
    assert got["containerd"].endswith("(asked: containerd --version)")
    assert got["Precondition not met"] == (
        "containerd: found 1.6.20, needs >= 1.7; fix: nox -s node-deps"
    )
    assert shutil.which("containerd")
