"""Every precondition of every target, unmet: a stand-in on PATH that is missing or too old (or,
for what is not a program, the real thing made unfit), and the one line it gives.

The line names the component, the version found, the version needed and the fix; the runs that
such a line blocks are tested end to end in test_blocked_runs.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hvconform.contract import hostfacts
from hvconform.contract.preconditions import Finding, Requirement
from hvconform.targets import preflight
from hvconform.targets.cluster.kindbin import KIND_VERSION
from hvconform.targets.local.runtime import workload_python
from hvconform.targets.realnode import REPO
from hvconform.targets.realnode import preflight as node_preflight
from hvconform.targets.realnode.runtimes import RUNTIMES
from tests.setup.support import standin, unreachable_python

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


def requirement(target: str, runtime: str, component: str) -> Requirement:
    found = [r for r in preflight(target, runtime).preconditions(target, runtime)]
    (req,) = [r for r in found if r.component == component]
    return req


def assert_unmet(finding: Finding, found: str, need: str, fix: str) -> None:
    line = finding.line()
    assert not finding.ok, line
    assert "\n" not in line
    assert line.startswith(f"{finding.component}: found {found}"), line
    assert f"needs {need}" in line and line.endswith(f"fix: {fix}"), line


M = "missing (not on PATH)"
BOOT = "scripts/bootstrap (apt-get install docker.io podman crun debootstrap)"
KIND_FIX = (
    f"nox -s kind-image (builds kind {KIND_VERSION} into its cache), or "
    f"go install sigs.k8s.io/kind@{KIND_VERSION} and put it first on PATH"
)
UL = "apt-get install util-linux mount"
DOCKER_FIX = "start the Docker engine (systemctl start docker) or install docker.io"
CONTAINERD_16 = "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3"
# target, runtime, component, program, its answer (None: not on PATH), found, needed, fix
CASES = [
    ("local", "process", "mount (util-linux)", "mount", "mount from util-linux 2.20.1",
     "2.20.1", ">= 2.27", UL),
    ("local", "process", "mount (util-linux)", "mount", None, M, ">= 2.27", UL),
    ("local", "process", "nsenter (util-linux)", "nsenter", "nsenter from util-linux 2.19",
     "2.19", ">= 2.27", UL),
    ("local", "container", "Docker engine (dockerd)", "dockerd",
     "Docker version 19.03.15, build 99e3ed8", "19.3.15", ">= 20.10", BOOT),
    ("local", "container", "Docker engine (dockerd)", "dockerd", None, M, ">= 20.10", BOOT),
    ("local", "container", "containerd", "containerd",
     "containerd github.com/containerd/containerd 1.5.9 1.5.9-1", "1.5.9", ">= 1.6", BOOT),
    ("local", "container", "podman", "podman", "podman version 3.4.4", "3.4.4", ">= 4.1", BOOT),
    ("local", "container", "podman", "podman", None, M, ">= 4.1", BOOT),
    ("local", "container", "crun", "crun", "crun version 0.17", "0.17", ">= 1.0", BOOT),
    ("local", "container", "debootstrap", "debootstrap", None, M, ">= 1.0", BOOT),
    ("node", "process", "containerd", "containerd", CONTAINERD_16, "1.6.20~ds1",
     ">= 1.7 with CDI (enable_cdi)", RUNTIMES["containerd-1.7"].fix),
    ("node", "process", "containerd", "containerd", None, M, ">= 1.7 with CDI (enable_cdi)",
     RUNTIMES["containerd-1.7"].fix),
    ("node", "process", "runc", "runc", "runc version 1.0.0-rc93", "1.0.0", ">= 1.1",
     "apt-get install runc"),
    # v0.27 writes kubeadm v1beta3, which the v1.37 node image's kubeadm refuses (CI, live)
    ("kind", "process", "kind", "kind", "kind v0.27.0 go1.23.4 linux/amd64", "0.27.0",
     ">= 0.32", KIND_FIX),
    ("kind", "process", "kind", "kind", None, M, ">= 0.32", KIND_FIX),
    ("aks", "process", "az", "az", "2.40.0", "2.40.0", ">= 2.50",
     "install the Azure CLI (apt-get install azure-cli) and az login"),
    ("aks", "process", "az", "az", None, M, ">= 2.50",
     "install the Azure CLI (apt-get install azure-cli) and az login"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("target", "runtime", "component", "program", "answer", "found", "need", "fix"),
    CASES,
    ids=[f"{c[0]}-{c[1]}-{c[3]}-{'missing' if c[4] is None else 'old'}" for c in CASES],
)
def test_a_program_missing_or_too_old(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    target: str,
    runtime: str,
    component: str,
    program: str,
    answer: str | None,
    found: str,
    need: str,
    fix: str,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if answer is not None:
        standin(bin_dir, program, answer)
    monkeypatch.setenv("PATH", str(bin_dir))  # nothing else: a missing program is missing
    monkeypatch.delenv("HV_DOCKER_HOST", raising=False)
    assert_unmet(requirement(target, runtime, component).check(), found, need, fix)


def test_a_docker_engine_that_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin(tmp_path, "docker", "Cannot connect to the Docker daemon. Is it running?", code=1)
    monkeypatch.setenv("PATH", str(tmp_path))
    finding = requirement("kind", "process", "Docker engine").check()
    failed = "missing (`docker version --format {{.Server.Version}}` failed)"
    assert_unmet(finding, failed, ">= 20.10", DOCKER_FIX)


def test_helm_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HV_HELM", "/nonexistent/helm")
    for target in ("kind", "aks"):
        finding = requirement(target, "process", "helm").check()
        assert not finding.ok and finding.found == "unusable", finding.line()


def test_containerd_17_without_cdi_and_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer = "containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6"
    standin(tmp_path / "a", "containerd", answer, config="[plugins]\n  snapshotter = x")
    monkeypatch.setenv("PATH", str(tmp_path / "a"))
    finding = node_preflight.containerd_cdi().check()
    assert_unmet(finding, "1.7.24~ds1 without enable_cdi in its default config",
                 ">= 1.7 with CDI (enable_cdi)", RUNTIMES["containerd-1.7"].fix)  # fmt: skip
    standin(tmp_path / "b", "containerd", answer, config="    enable_cdi = false")
    monkeypatch.setenv("PATH", str(tmp_path / "b"))
    finding = node_preflight.containerd_cdi().check()
    assert finding.ok and finding.found == "1.7.24~ds1 (enable_cdi)", finding.line()


@pytest.mark.parametrize("name", sorted(node_preflight.BUILT))
def test_node_binaries_missing_or_another_version(tmp_path: Path, name: str) -> None:
    want = node_preflight.BUILT[name][2]
    req = node_preflight.built(name, bin_dir=tmp_path)
    assert_unmet(req.check(), f"missing ({tmp_path / name})", f"{want} built in {tmp_path}",
                 "nox -s node-build")  # fmt: skip
    answers = {"kubelet": "Kubernetes v1.36.9", "kube-apiserver": "Kubernetes v1.36.9",
               "etcd": "etcd Version: 3.5.0", "crictl": "crictl version v1.30.0"}  # fmt: skip
    standin(tmp_path, name, answers[name])
    found = answers[name].split()[-1]
    assert_unmet(req.check(), found, f"{want} built in {tmp_path}", "nox -s node-build")
    standin(tmp_path, name, answers[name].replace(found, want))
    assert req.check().ok


def test_go_too_old(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    standin(tmp_path, "go", "go version go1.21.5 linux/amd64")
    monkeypatch.setenv("PATH", str(tmp_path))
    req = hostfacts.go_toolchain(REPO / "gobuild" / "build" / "go.mod", "building the node")
    assert_unmet(req.check(), "1.21.5", ">= 1.26.0",
                 "install Go >= 1.26.0 and put its bin directory on PATH")  # fmt: skip


def test_root_needed() -> None:
    """The requirement evaluated in a process that dropped to uid 65534 after its imports."""
    code = (
        "import os; from hvconform.contract import hostfacts as h; "
        "os.setgroups([]); os.setgid(65534); os.setuid(65534); print(h.root('x').check().line())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True, timeout=60).stdout.strip()  # fmt: skip
    assert out == "root: found uid 65534, needs uid 0 (x); fix: run as root (sudo ./dev conform)"


def test_kvm_absent_not_a_device_or_not_kvm(tmp_path: Path) -> None:
    fix = "load kvm (modprobe kvm_intel or kvm_amd) on a machine with hardware virtualisation"
    need = "a usable character device (KVM API 12)"
    absent = tmp_path / "kvm"
    msg = f"no {absent} (No such file or directory)"
    assert_unmet(hostfacts.kvm("x", str(absent)).check(), msg, need, fix)
    absent.write_text("")
    msg = f"{absent} that is not a character device"
    assert_unmet(hostfacts.kvm("x", str(absent)).check(), msg, need, fix)
    null = tmp_path / "null"
    os.mknod(null, 0o600 | 0o020000, os.stat("/dev/null").st_rdev)  # /dev/null's numbers
    finding = hostfacts.kvm("x", str(null)).check()
    assert not finding.ok and finding.found.startswith(f"{null} refusing KVM_GET_API_VERSION")
    assert hostfacts.kvm("x").check().ok  # the real one


@pytest.fixture
def no_python() -> Iterator[Path]:
    workload_python.cache_clear()
    with unreachable_python() as python:
        yield python
    workload_python.cache_clear()


def test_no_interpreter_for_workloads(no_python: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HV_WORKLOAD_PYTHON", str(no_python))
    finding = requirement("local", "process", "workload interpreter").check()
    assert not finding.ok and "\n" not in finding.line()
    assert finding.found.startswith(
        "no Python >= 3.11 that uid 65534 gid 65534 can execute with the guest program "
        f"(tried {no_python}: workload not started (exit 126): exec {no_python}"
    ), finding.found
    assert finding.line().endswith(
        "or set HV_WORKLOAD_PYTHON to a Python >= 3.11 outside 0700 directories"
    )


def test_cgroup_controller_missing() -> None:
    finding = hostfacts.cgroups("x", ("cpu", "no-such-controller")).check()
    layout = hostfacts.cgroup_layout()
    assert_unmet(finding, f"cgroup {layout['version']} without no-such-controller",
                 "cgroup v1 or v2 with cpu, no-such-controller",
                 "mount the cgroup hierarchy at /sys/fs/cgroup (a systemd or container default)")  # fmt: skip


def test_a_port_in_use() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        finding = hostfacts.free_ports("x", [port]).check()
    assert_unmet(finding, f"127.0.0.1 ports {port} in use", f"127.0.0.1 ports {port} free",
                 f"stop what listens there (ss -ltnp | grep -E ':({port})')")  # fmt: skip
