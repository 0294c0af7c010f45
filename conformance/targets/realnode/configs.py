"""What the real node runs, as text and objects: containerd's and the kubelet's configuration and
the workload pod. Kept apart from `stack` (which starts things) so tests can read them alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvconform.contract.datafiles import import_name, package_dir
from hvconform.targets.realnode import (
    CDI_DIR,
    CONTAINERD_SOCKET,
    NODE_NAME,
    PAUSE_IMAGE,
    RUN,
    STATE,
)

PKI = STATE / "pki"
# Where a workload finds the guest program: the suite's own package (the checkout's conformance/
# or site-packages/hvconform), mounted read-only under its import name.
PACKAGES = "/hv-packages"
KUBELET_HEALTHZ = 20248
KUBELET_PORT = 20250
NAMESPACE = "default"


@dataclass(frozen=True)
class ContainerdPaths:
    """Where a node's containerd keeps things: the default node's, or a cluster-mode node's own."""

    root: Path = STATE / "containerd"
    state: Path = RUN / "containerd" / "state"
    socket: Path = CONTAINERD_SOCKET
    cdi_dir: Path = CDI_DIR
    cni: Path = RUN / "cni"


def containerd_config(paths: ContainerdPaths | None = None) -> str:
    """A node's containerd in config version 2 (containerd 1.7)."""
    p = paths or ContainerdPaths()
    root, state, socket, cdi_dir, cni = p.root, p.state, p.socket, p.cdi_dir, p.cni
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  enable_cdi = true
  # This machine withholds CAP_SYS_RESOURCE: oom_score_adj cannot go below ours (pause wants -998).
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["{cdi_dir}"]
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{cni / "bin"}"
    conf_dir = "{cni / "net.d"}"
"""


def containerd_config_v3(
    *, runc: str, cdi: bool = True, paths: ContainerdPaths | None = None
) -> str:
    """The same node for containerd 2.x, in config version 3: the CRI plugin split in three
    (images: snapshotter and the sandbox image; runtime: CDI, runtimes and CNI; the gRPC CRI
    server: streaming), runc named by path (the runtime's own, not PATH's)."""
    p = paths or ContainerdPaths()
    root, socket, cdi_dir, cni = p.root, p.socket, p.cdi_dir, p.cni
    images = "plugins.'io.containerd.cri.v1.images'"
    rt = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""version = 3
root = "{root}"
state = "{p.state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "{root / "opt"}"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
[{images}]
  snapshotter = "overlayfs"
  [{images}.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[{rt}]
  enable_cdi = {str(cdi).lower()}
  # This machine withholds CAP_SYS_RESOURCE: oom_score_adj cannot go below ours (pause wants -998).
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["{cdi_dir}"]
  [{rt}.containerd]
    default_runtime_name = "runc"
    [{rt}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{rt}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{runc}"
  [{rt}.cni]
    bin_dirs = ["{cni / "bin"}"]
    conf_dir = "{cni / "net.d"}"
"""


def kubelet_config(
    *,
    address: str = "127.0.0.1",
    port: int = KUBELET_PORT,
    healthz: int = KUBELET_HEALTHZ,
    socket: Path = CONTAINERD_SOCKET,
    static: Path = RUN / "manifests",
    extra: str = "",
) -> str:
    """The default node's kubelet; cluster-mode nodes pass their own ports and runtime, and in
    `extra` their cgroup root (two kubelets on one machine never share /kubepods) and serving
    certificate (the API server verifies it for logs and exec)."""
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {address}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {PKI / "ca.crt"}}}
authorization: {{mode: AlwaysAllow}}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{socket}
staticPodPath: {static}
fileCheckFrequency: 1s
syncFrequency: 5s
nodeStatusUpdateFrequency: 1s
nodeStatusReportFrequency: 1s
evictionHard: {{memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: ""
serializeImagePulls: false
makeIPTablesUtilChains: false
{extra}"""


def workload_pod(name: str, resource: str, command: list[str], state: Path) -> dict[str, Any]:
    """A host-network pod of the offline image: the host's /usr and the suite's package,
    read-only."""
    suite = package_dir()
    vols = {
        "usr": ("/usr", "/usr", True),
        "suite": (str(suite), f"{PACKAGES}/{import_name()}", True),
        "state": (str(state), "/state", False),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "hv-node-workload"}},
        "spec": {
            "nodeName": NODE_NAME,
            "hostNetwork": True,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"operator": "Exists"}],
            "securityContext": {"runAsUser": 65534, "runAsGroup": 65534, "runAsNonRoot": True},
            "containers": [
                {
                    "name": "workload",
                    "image": PAUSE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": command,
                    "env": [{"name": "PYTHONPATH", "value": PACKAGES}],
                    "resources": {"limits": {resource: "1"}},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [
                        {"name": n, "mountPath": m, "readOnly": ro}
                        for n, (_, m, ro) in vols.items()
                    ],
                }
            ],
            "volumes": [{"name": n, "hostPath": {"path": h}} for n, (h, _, _) in vols.items()],
        },
    }
