"""An offline kind node image (issue 19): `nox -s kind-image` and the engine kind runs under.

Nothing is pulled. The root filesystem is debootstrap's (bookworm, systemd); containerd is
trixie's 1.7 package (CDI) or, in the image of `--runtime containerd-2.3`, containerd 2.x and runc
built from their modules as the node target's (issue 38); the Kubernetes components are the real
node target's builds of the pinned release plus kubeadm, kubectl and kube-proxy from the same
build module, and every image kubeadm asks for is built from those binaries and preloaded into
the image's containerd under the name kubeadm uses. The recipe (units, configs, entrypoint,
Dockerfile) is kind/node/.
"""

from __future__ import annotations

from pathlib import Path

from hvconform.targets.cluster.kindbin import KIND_CACHE
from hvconform.targets.realnode import CONTAINERD2_VERSION, KUBERNETES_VERSION, REPO

CACHE = KIND_CACHE
BIN = CACHE / "bin"
RECIPE = REPO / "kind" / "node"
COREDNS_VERSION = "v1.14.6"  # the one kubeadm v1.37.2 deploys (`kubeadm config images list`)
ETCD_VERSION = "v3.7.0"  # kubeadm v1.37.2's etcd image is 3.7.0-0: the same release, built here
CONTAINERD_DEB = "1.7.24~ds1-6+deb13u1"  # trixie's, as `nox -s node-deps` installs on the host
NODE_REPOSITORY = "hv-kind.local/node"
NODE_IMAGE = f"{NODE_REPOSITORY}:{KUBERNETES_VERSION}"
# The node's container runtime, by the node target's names (realnode/runtimes.py): the default
# image runs trixie's containerd 1.7; the other runs containerd 2.x (config version 3), tagged
# with its version, as current stock kindest/node images and AKS nodes do.
NODE_RUNTIMES = ("containerd-1.7", "containerd-2.3")


def node_image(runtime: str = "") -> str:
    """The offline node image of `runtime` ('' is containerd-1.7: NODE_IMAGE)."""
    if runtime in ("", NODE_RUNTIMES[0]):
        return NODE_IMAGE
    if runtime == "containerd-2.3":
        return f"{NODE_IMAGE}-containerd-{CONTAINERD2_VERSION}"
    raise ValueError(f"no kind node image for runtime {runtime!r}: {', '.join(NODE_RUNTIMES)}")


KEY_LABEL = "dev.hyperlight.hv.kind-node-key"
ROOTFS_PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "iptables", "nftables", "iproute2", "kmod", "mount",
    "util-linux", "procps", "ca-certificates", "runc", "libseccomp2", "conntrack", "ethtool",
    "socat",
)  # fmt: skip
# The private engine kind runs under here: its own roots, bridge networks allowed (kind makes
# its "kind" network), still no iptables rules, NAT or default bridge.
ENGINE_DATA_ROOT = Path("/var/lib/hv-kind-docker")
ENGINE_EXEC_ROOT = Path("/run/hv-kind-docker")
ENGINE_HOST = f"unix://{ENGINE_EXEC_ROOT}/docker.sock"
