"""The real node target (issue #9): a real kubelet, API server and containerd on this machine.

Nothing of Kubernetes' source is committed: `build` compiles the components from the published Go
modules of one pinned release into CACHE; `stack` starts them as host processes on loopback
(containerd with CDI for a dedicated CDI dir, etcd, the control plane, the kubelet registered as a
Node) and stops and removes all of it; `realnode` implements the Node Protocol against it.
Every path the stack owns is below one of the roots here, so `node-down` can prove it removed all.
"""

from __future__ import annotations

from pathlib import Path

from hv_device_plugin.api.wire import DEVICE_PLUGIN_DIR, KUBELET_SOCKET, POD_RESOURCES_DIR

KUBERNETES_VERSION = "v1.37.2"
STAGING_VERSION = "v0.37.2"  # the staging modules are tagged v0.<minor>.<patch> with the release
ETCD_VERSION = "v3.7.3"
CRICTL_VERSION = "v1.37.0"
# containerd 2.x as AKS runs it (2.3.3 on AKS 1.35.7 / Ubuntu 24.04; the Go module proxy serves
# no v2.3.3, v2.3.7 is the nearest 2.3.x it does) and a runc of the 1.4 line, built from their
# modules (`nox -s node-build -- containerd2 runc`) beside Debian trixie's containerd 1.7.24
CONTAINERD2_VERSION = "v2.3.7"
RUNC_VERSION = "v1.4.4"
# ptp + host-local + loopback: pod networks for the cluster-mode nodes (`node-up --nodes N`)
CNI_VERSION = "v1.10.0"
CNI_PLUGINS = ("ptp", "host-local", "loopback")

REPO = Path(__file__).resolve().parents[3]
CACHE = Path("/var/cache/hv-node")  # build outputs; survives node-down
BIN = CACHE / "bin"
CONTAINERD2_BIN = BIN / f"containerd-{CONTAINERD2_VERSION}"  # containerd, its shim, runc
STATE = Path("/var/lib/hv-node")  # etcd data, containerd root, certificates
RUN = Path("/run/hv-node")  # sockets, pid files, logs, the CDI dir
PLUGIN_DIR = Path(DEVICE_PLUGIN_DIR)  # fixed by the kubelet
KUBELET_ROOT = PLUGIN_DIR.parent
PODRESOURCES_SOCKET = Path(POD_RESOURCES_DIR) / KUBELET_SOCKET
CDI_DIR = RUN / "cdi"  # containerd's only CDI dir: the host's /etc/cdi and /var/run/cdi stay out
HOST_DEV = RUN / "host-dev"  # the plugin's host-device view (mknod copy of /dev/kvm)
CONTAINERD_SOCKET = RUN / "containerd" / "containerd.sock"
PAUSE_IMAGE = "hv-node.local/pause:1"
NODE_NAME = "hv-node"
API_PORT = 16443
# The Service range; its first address is the `kubernetes` Service's, which the cluster-mode
# nodes serve on lo (api_relay): pods reach the API server in-cluster, as anywhere else.
SERVICE_CIDR = "10.87.1.0/24"
SERVICE_IP = "10.87.1.1"
ETCD_CLIENT_PORT = 12379
ETCD_PEER_PORT = 12380
# Feature gates the node stack sets on its components: none, so v1.37.2's defaults hold (the
# run's environment says so, with the components' own word: hvconform.contract.featuregates).
FEATURE_GATES: dict[str, bool] = {}
