"""The real node's hooks for the suite: what `--target node` needs before its first check, and
the version of every component it ran, asked from the binaries themselves.

The node needs containerd >= 1.7 (CDI injection: bookworm's 1.6.20 has none, so the plugin would
be blamed for "allocation carries no CDI device"), runc, and the kubelet, API server, etcd and
crictl that `nox -s node-build` builds at the pinned release; its ports free unless our own
stack (`nox -s node-up`) already holds them; a cgroup hierarchy for the kubelet's cgroupfs
driver. Go is needed only while something is still to be built.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from hvconform.contract import hostfacts, runcontext
from hvconform.contract.preconditions import (
    Found,
    Requirement,
    ask,
    tool,
    version_of,
    version_tuple,
)
from hvconform.contract.target_options import NodeOptions
from hvconform.targets.local.preflight import local_requirements
from hvconform.targets.realnode import (
    API_PORT,
    BIN,
    CRICTL_VERSION,
    ETCD_CLIENT_PORT,
    ETCD_PEER_PORT,
    ETCD_VERSION,
    KUBERNETES_VERSION,
    REPO,
    procs,
    runtimes,
)
from hvconform.targets.realnode.configs import KUBELET_HEALTHZ, KUBELET_PORT, kubelet_config
from hvconform.targets.realnode.runtimes import NodeRuntime

CONTAINERD_MINIMUM = "1.7"
BUILD_FIX = "nox -s node-build"
PLUGIN_HEALTH_PORT = 18080  # stack.PLUGIN_HEALTH
PORTS = (
    API_PORT,
    ETCD_CLIENT_PORT,
    ETCD_PEER_PORT,
    KUBELET_PORT,
    KUBELET_HEALTHZ,
    PLUGIN_HEALTH_PORT,
)
# What each binary prints for --version, and the version the pins want.
BUILT: dict[str, tuple[list[str], str, str]] = {
    "kubelet": (["--version"], r"Kubernetes (\S+)", KUBERNETES_VERSION),
    "kube-apiserver": (["--version"], r"Kubernetes (\S+)", KUBERNETES_VERSION),
    "etcd": (["--version"], r"etcd Version: (\S+)", ETCD_VERSION.lstrip("v")),
    "crictl": (["--version"], r"crictl version (\S+)", CRICTL_VERSION),
}
CONTAINERD_PATTERN = r"containerd\s+\S+\s+v?(\S+)"
# crictl from `go install` answers "crictl version unknown" (its version is an ldflag): then its
# version is the main module's, read from the build info embedded in the binary.
MAIN_MODULE = {"crictl": "sigs.k8s.io/cri-tools", "etcd": "go.etcd.io/etcd/server/v3"}


def chosen_runtime() -> NodeRuntime:
    """The run's node runtime (--node-runtime, from its run context); the default outside one."""
    try:
        name = runcontext.current().options_of(NodeOptions).node_runtime
    except (RuntimeError, OSError, ValueError):
        name = ""
    return runtimes.runtime(name)


def containerd_cdi(rt: NodeRuntime | None = None) -> Requirement:
    """The runtime's containerd, >= 1.7, whose CRI knows `enable_cdi` (asked from its default
    config: 1.7's CRI plugin and 2.x's CRI runtime plugin both print it)."""
    rt = rt or chosen_runtime()
    binary = rt.binary("containerd") or "containerd"

    def probe() -> Found:
        line, shown = ask([binary, "--version"])
        if line is None:
            where = "not on PATH" if rt.bin_dir is None else f"not built: {rt.bin_dir}"
            return Found(f"missing ({where})", False, shown)
        found = version_of([binary, "--version"], CONTAINERD_PATTERN)["version"]
        have = version_tuple(found)
        if have is None or have < (version_tuple(CONTAINERD_MINIMUM) or ()):
            return Found(found, False, shown)
        if "enable_cdi" not in _containerd_default_config(binary):
            return Found(f"{found} without enable_cdi in its default config", False, shown)
        return Found(f"{found} (enable_cdi)", True, shown)

    return Requirement(
        "containerd",
        f"CDI device injection into the workload pods ({rt.name})",
        f">= {CONTAINERD_MINIMUM} with CDI (enable_cdi)",
        rt.fix,
        probe,
    )


def _containerd_default_config(binary: str = "containerd") -> str:
    try:
        return subprocess.run(
            [binary, "config", "default"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def built(name: str, bin_dir: Path = BIN) -> Requirement:
    """A binary of `nox -s node-build` in bin_dir that says it is the pinned version."""
    want = BUILT[name][2]

    def probe() -> Found:
        binary = bin_dir / name
        if not binary.exists():
            return Found(f"missing ({binary})", False, str(binary))
        got = binary_version(name, bin_dir)
        return Found(got["version"], got["version"] == want, got["command"])

    return Requirement(name, f"the node's {name}", f"{want} built in {bin_dir}", BUILD_FIX, probe)


def binary_version(name: str, bin_dir: Path = BIN) -> dict[str, str]:
    """What the built binary says with --version; its module's version from the build info
    when it does not know its own ("unknown")."""
    args, pattern, _ = BUILT[name]
    binary = str(bin_dir / name)
    got = version_of([binary, *args], pattern)
    module = MAIN_MODULE.get(name)
    if (
        module is None
        or version_tuple(got["version"]) is not None
        or got["version"] == "unavailable"
    ):
        return got
    info = _go_build_info(binary)
    match = re.search(rf"^\s*mod\s+{re.escape(module)}\s+(\S+)", info, re.MULTILINE)
    if match is None:
        return got
    version = match.group(1)
    return {
        "version": version,
        "command": f"go version -m {binary}",
        "output": f"mod {module} {version}",
    }


def _go_build_info(binary: str) -> str:
    try:
        return subprocess.run(
            ["go", "version", "-m", binary], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _stack_up() -> bool:
    """Our own stack (nox -s node-up) is running: the ports are ours, the target reuses it."""
    return any((p := procs.recorded(n)) is not None and p.alive for n in ("kubelet", "etcd"))


def preconditions(target: str = "node", runtime: str = "process") -> list[Requirement]:
    del target, runtime
    local = [r for r in local_requirements() if r.component in ("root", "/dev/kvm")]
    rt = chosen_runtime()
    needs: list[Requirement] = [*local, containerd_cdi(rt)]
    needs.append(
        tool(
            "runc",
            [rt.binary("runc") or "runc", "--version"],
            minimum="1.1",
            feature=f"containerd's OCI runtime for the workload pods ({rt.name})",
            fix="apt-get install runc" if rt.bin_dir is None else rt.fix,
        )
    )
    if any(not (BIN / name).exists() for name in (*BUILT, "pause")):
        needs.append(
            hostfacts.go_toolchain(
                REPO / "gobuild" / "build" / "go.mod", "building the node (node-build)"
            )
        )
    needs += [built(name) for name in BUILT]
    needs.append(hostfacts.cgroups("the kubelet's cgroupfs driver", ("cpu", "memory", "pids")))
    if not _stack_up():
        needs.append(hostfacts.free_ports("the node's API server, etcd, kubelet, plugin", PORTS))
    return needs


def environment(
    target: str = "node", runtime: str = "process", bin_dir: Path = BIN
) -> dict[str, Any]:
    """Every component's version as the binary reports it; the kubelet's cgroup driver."""
    del target, runtime
    components = {name: binary_version(name, bin_dir) for name in BUILT}
    rt = chosen_runtime()
    containerd, runc = rt.binary("containerd") or "containerd", rt.binary("runc") or "runc"
    components["containerd"] = version_of([containerd, "--version"], CONTAINERD_PATTERN)
    components["runc"] = version_of([runc, "--version"], r"runc version (\S+)")
    driver = re.search(r"^cgroupDriver: (\S+)", kubelet_config(), re.MULTILINE)
    return {"components": components, "cgroup_driver": driver.group(1) if driver else "unknown"}
