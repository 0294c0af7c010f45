"""Cluster-mode nodes: `nox -s node-up -- --nodes N`, N kubelets of one cluster on this machine.

The control plane is the default node's (`stack`); each node is then a process tree of its own
under a node init (`nodeinit`, PID 1 of the node's PID namespace, in its own mount namespace):
its own containerd (root, state, socket), its own /var/lib/kubelet (plugin directory,
pod-resources socket), its own CDI dir at the manifests' /var/run/cdi, its own kubelet ports and
cgroup root, its own pod subnet (ptp + host-local CNI: the plugin's DaemonSets are not
host-network pods). Every node registers as a Node labelled for the KVM manifests, with a client
certificate of its own name (the Node authorizer applies) and a serving certificate the API
server verifies (logs, exec). Nothing of the host's own /var/lib/kubelet or /run/cdi is touched:
those paths are mount points inside the nodes only.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hv_device_plugin.api.names import HYPERVISOR_RESOURCE
from hv_device_plugin.api.wire import CDI_DYNAMIC_DIR
from hvconform.contract.nodeinit import CRICTL, SELF
from hvconform.targets.realnode import (
    API_PORT,
    BIN,
    CNI_PLUGINS,
    NODE_NAME,
    RUN,
    SERVICE_CIDR,
    SERVICE_IP,
    STATE,
    procs,
    runtimes,
)
from hvconform.targets.realnode.configs import (
    KUBELET_HEALTHZ,
    KUBELET_PORT,
    PKI,
    ContainerdPaths,
    containerd_config,
    containerd_config_v3,
    kubelet_config,
)
from hvconform.targets.realnode.hostclean import CGROUP_V1
from hvconform.targets.realnode.image import import_image
from hvconform.targets.realnode.kubeapi import Api, ApiError
from hvconform.targets.realnode.pki import _sign, kubeconfig
from hvconform.targets.realnode.runtimes import NodeRuntime

NODES_RUN = RUN / "nodes"
NODES_STATE = STATE / "nodes"
NODE_CDI = Path(CDI_DYNAMIC_DIR)  # where the manifests' plugin writes: one tmpfs per node
HOST_MADE = RUN / "nodes-host-dirs"  # host dirs made as mount points, removed by node-down
CGROUP_PARENT = "hv-nodes"
ADMIN_KUBECONFIG = RUN / "admin.kubeconfig"
NODE_LABELS = f"{HYPERVISOR_RESOURCE}=kvm"  # what the KVM manifests' node affinity selects
MAX_NODES = 8
NODE_IP_PREFIX = "10.87.0."
# Every node's pod subnet (NodeLayout.subnet): a pod reaches another node's pods through this
# machine, which ptp gives a route to each pod (a Sonobuoy worker sends its results to the
# aggregator's pod, wherever that runs).
POD_RANGE = "10.88.0.0/16"
SERVICE_RELAY = "service-relay"
PORT_STRIDE = 10


@dataclass(frozen=True)
class NodeLayout:
    index: int  # 1..N; node 1 keeps the default node's name (and its client certificate)

    @property
    def name(self) -> str:
        return NODE_NAME if self.index == 1 else f"{NODE_NAME}-{self.index}"

    @property
    def run(self) -> Path:
        return NODES_RUN / self.name

    @property
    def state(self) -> Path:
        return NODES_STATE / self.name

    @property
    def socket(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def port(self) -> int:
        return KUBELET_PORT + PORT_STRIDE * (self.index - 1)

    @property
    def healthz(self) -> int:
        return KUBELET_HEALTHZ + PORT_STRIDE * (self.index - 1)

    @property
    def ip(self) -> str:
        """The node's address (on lo): the kubelet refuses a loopback node IP, and the API server
        reaches the kubelet there for logs and exec."""
        return f"{NODE_IP_PREFIX}{self.index}"

    @property
    def subnet(self) -> str:
        return f"10.88.{self.index}.0/24"  # within POD_RANGE

    @property
    def cgroup(self) -> str:
        return f"/{CGROUP_PARENT}/{self.name}"


def layouts(count: int) -> list[NodeLayout]:
    return [NodeLayout(i) for i in range(1, count + 1)]


def recorded_nodes() -> list[NodeLayout]:
    """The nodes node-up started (by their run dirs), in index order."""
    if not NODES_RUN.is_dir():
        return []
    names = {p.name for p in NODES_RUN.iterdir() if p.is_dir()}
    return [n for n in layouts(MAX_NODES) if n.name in names]


def crictl_argv(node: NodeLayout) -> list[str]:
    """crictl on the node's containerd, with a config file of its own (none read from /etc)."""
    config = node.run / "crictl.yaml"
    if not config.exists():
        config.write_text(f"runtime-endpoint: unix://{node.socket}\ntimeout: 20\n")
    return [str(BIN / "crictl"), "--config", str(config)]


def _certs(node: NodeLayout) -> None:
    """A client certificate for the node's own name, and a kubelet serving certificate."""
    ext = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
    client = f"kubelet-{node.name}"
    if not (PKI / f"{client}.crt").exists():
        _sign(PKI, client, f"/O=system:nodes/CN=system:node:{node.name}",
              ext + "extendedKeyUsage=clientAuth\n")  # fmt: skip
    serving = f"kubelet-serving-{node.name}"
    san = f"subjectAltName=IP:{node.ip},DNS:{node.name}\n"
    if not (PKI / f"{serving}.crt").exists():
        _sign(PKI, serving, f"/O=system:nodes/CN=system:node:{node.name}",
              ext + "extendedKeyUsage=serverAuth\n" + san)  # fmt: skip


def _cgroups(node: NodeLayout) -> None:
    """The node's cgroup root in every v1 hierarchy (the kubelet refuses a missing one)."""
    for hierarchy in sorted(CGROUP_V1.iterdir()):
        if hierarchy.name == "unified" or not (hierarchy / "cgroup.procs").exists():
            continue
        chain = [hierarchy / CGROUP_PARENT, hierarchy / CGROUP_PARENT / node.name]
        for path in chain:
            path.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):  # a new cpuset starts empty
                mine, parent = path / knob, path.parent / knob
                if mine.exists() and not mine.read_text().strip():
                    mine.write_text(parent.read_text())


def cgroup_dirs() -> list[Path]:
    if not CGROUP_V1.is_dir():
        return []
    return [h / CGROUP_PARENT for h in CGROUP_V1.iterdir() if (h / CGROUP_PARENT).is_dir()]


def _cni(node: NodeLayout) -> None:
    (node.run / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
    bin_link = node.run / "cni" / "bin"
    if not bin_link.is_symlink():
        bin_link.symlink_to(BIN / "cni")
    conf = {
        "cniVersion": "1.0.0",
        "name": node.name,
        "plugins": [
            {
                "type": "ptp",
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": node.subnet}]],
                    # the pods' routes off their link: the `kubernetes` Service's range and
                    # the other nodes' pods
                    "routes": [{"dst": SERVICE_CIDR}, {"dst": POD_RANGE}],
                    "dataDir": str(node.state / "ipam"),
                },
            }
        ],
    }
    (node.run / "cni" / "net.d" / "10-hv-node.conflist").write_text(json.dumps(conf, indent=1))


def _spec(node: NodeLayout, rt: NodeRuntime) -> Path:
    """What the node init needs: mounts, the containerd and kubelet command lines."""
    (node.state / "kubelet").mkdir(parents=True, exist_ok=True)
    # Pod logs of its own: a kubelet's container GC removes every /var/log/pods dir of a pod it
    # does not know (the other nodes' pods, each minute), and its log manager then reopens the
    # container's log empty: a guest's output, written before, was lost.
    for logs in ("pods", "containers"):
        (node.state / "log" / logs).mkdir(parents=True, exist_ok=True)
    (node.run / "manifests").mkdir(parents=True, exist_ok=True)
    containerd_cfg = node.run / "containerd.toml"
    paths = ContainerdPaths(
        root=node.state / "containerd",
        state=node.run / "containerd-state",
        socket=node.socket,
        cdi_dir=rt.cdi_dir(NODE_CDI),
        cni=node.run / "cni",
    )
    containerd_cfg.write_text(
        containerd_config_v3(runc=rt.binary("runc"), cdi=rt.cdi, paths=paths)
        if rt.config_version == 3
        else containerd_config(paths)
    )
    serving = PKI / f"kubelet-serving-{node.name}"
    extra = (
        f"cgroupRoot: {node.cgroup}\ntlsCertFile: {serving}.crt\ntlsPrivateKeyFile: {serving}.key\n"
    )
    kubelet_cfg = node.run / "kubelet.yaml"
    kubelet_cfg.write_text(
        kubelet_config(
            address=node.ip,
            port=node.port,
            healthz=node.healthz,
            socket=node.socket,
            static=node.run / "manifests",
            extra=extra,
        )
    )
    client = kubeconfig(PKI, f"kubelet-{node.name}", node.run / "kubelet.kubeconfig")
    kubelet = [
        str(BIN / "kubelet"), f"--config={kubelet_cfg}", f"--hostname-override={node.name}",
        f"--node-ip={node.ip}", "--root-dir=/var/lib/kubelet", f"--kubeconfig={client}",
        f"--node-labels={NODE_LABELS}", "--v=2",
    ]  # fmt: skip
    spec = {
        "run": str(node.run),
        "socket": str(node.socket),
        "mounts": [
            ["bind", str(node.state / "kubelet"), "/var/lib/kubelet"],
            ["bind", str(node.state / "log" / "pods"), "/var/log/pods"],
            ["bind", str(node.state / "log" / "containers"), "/var/log/containers"],
            ["tmpfs", "4m", str(NODE_CDI)],
            ["bind", str(node.run), SELF],
        ],
        "containerd": [rt.binary("containerd") or "containerd", "--config", str(containerd_cfg)],
        "kubelet": kubelet,
        "crictl": crictl_argv(node),
    }
    wrapper = node.run / Path(CRICTL).name  # the node's crictl, on its own containerd
    wrapper.write_text(f'#!/bin/sh\nexec {" ".join(crictl_argv(node))} "$@"\n')
    wrapper.chmod(0o755)
    path = node.run / "spec.json"
    path.write_text(json.dumps(spec, indent=1))
    return path


def prepare_host() -> None:
    """The mount points the nodes bind over must exist on the host; record what was made."""
    made = []
    for point in (Path("/var/lib/kubelet"), NODE_CDI.resolve(), Path(SELF)):
        if not point.exists():
            point.mkdir(parents=True)
            made.append(str(point))
    old = HOST_MADE.read_text().split() if HOST_MADE.exists() else []
    HOST_MADE.write_text("\n".join([*old, *made]) + "\n")


def _init_pid(node: NodeLayout, outer: procs.Proc) -> procs.Proc:
    """The node init's pid on this machine: the child `unshare --fork` made."""
    children = Path(f"/proc/{outer.pid}/task/{outer.pid}/children")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, IndexError):  # not forked yet
            pid = int(children.read_text().split()[0])
            started = procs.start_time(pid)
            if started is not None:
                (procs.PIDS / f"init-{node.name}.json").write_text(
                    json.dumps({"pid": pid, "started": started})
                )
                return procs.Proc(f"init-{node.name}", pid, started)
        time.sleep(0.05)
    raise RuntimeError(f"node {node.name}: no init process under unshare {outer.pid}")


def _address(ip: str) -> None:
    if ip not in _lo_addresses():
        subprocess.run(["ip", "addr", "add", f"{ip}/32", "dev", "lo"], check=True)


def _ours(ip: str) -> bool:
    """An address node-up puts on lo (the nodes', the `kubernetes` Service's)."""
    return ip.startswith(NODE_IP_PREFIX) or ip == SERVICE_IP


def start_service_relay() -> procs.Proc:
    """The `kubernetes` Service's address served (api_relay): pods reach the API server
    in-cluster, with no service proxy on this machine."""
    _address(SERVICE_IP)
    return procs.start(SERVICE_RELAY, [
        sys.executable, "-m", "hvconform.targets.realnode.api_relay",
        "--listen", f"{SERVICE_IP}:443", "--api-port", str(API_PORT)])  # fmt: skip


def _lo_addresses() -> list[str]:
    out = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", "lo"], capture_output=True)
    return [ln.split()[3].split("/")[0] for ln in out.stdout.decode().splitlines()]


def start_node(node: NodeLayout, rt: NodeRuntime | None = None) -> procs.Proc:
    """Node `node` in namespaces of its own, its init running `rt`'s containerd (the default
    runtime's when None): the runtime's directory first on PATH, for its shim."""
    rt = rt or runtimes.runtime("")
    for path in (node.run, node.state):
        path.mkdir(parents=True, exist_ok=True)
    _address(node.ip)
    _certs(node)
    _cgroups(node)
    _cni(node)
    spec = _spec(node, rt)
    outer = procs.start(
        f"node-{node.name}",
        ["unshare", "--pid", "--mount", "--mount-proc", "--fork", "--propagation", "slave",
         "--kill-child=SIGTERM", sys.executable, "-m", "hvconform.targets.realnode.nodeinit",
         str(spec)],
        env=rt.env(),
    )  # fmt: skip
    init = _init_pid(node, outer)
    deadline = time.monotonic() + 90
    while not (node.run / "ready").exists():
        if (node.run / "failed").exists() or not init.alive or time.monotonic() > deadline:
            why = (node.run / "failed").read_text() if (node.run / "failed").exists() else ""
            raise RuntimeError(
                f"node {node.name} did not start: {why or procs.log_tail(outer.name)}"
            )
        time.sleep(0.1)
    import_image(node.run, node.socket)
    return init


def wait_nodes_ready(api: Api, nodes: list[NodeLayout], timeout_s: float = 120) -> None:
    def ready(name: str) -> bool:
        try:
            node = api.get(f"/api/v1/nodes/{name}")
        except (ApiError, OSError):
            return False
        conds = node.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    deadline = time.monotonic() + timeout_s
    while not all(ready(n.name) for n in nodes):
        if time.monotonic() > deadline:
            late = [n.name for n in nodes if not ready(n.name)]
            raise RuntimeError(f"nodes not Ready after {timeout_s:g}s: {late}")
        time.sleep(0.5)


def stop_nodes() -> None:
    """Each node's init asked to stop (it removes its pods and stops containerd), then waited."""
    for node in reversed(recorded_nodes()):
        init = procs.recorded(f"init-{node.name}")
        if init is not None:
            init.stop(timeout_s=90)
        outer = procs.recorded(f"node-{node.name}")
        if outer is not None:
            outer.stop(timeout_s=10)
    if (relay := procs.recorded(SERVICE_RELAY)) is not None:
        relay.stop(timeout_s=15)


def remove_host_leftovers() -> None:
    """The nodes' cgroup roots and the mount points made on the host (after stop_nodes)."""
    for parent in cgroup_dirs():
        for sub in sorted(
            (p for p in parent.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
        ):
            with contextlib.suppress(OSError):
                sub.rmdir()
        with contextlib.suppress(OSError):
            parent.rmdir()
    for ip in _lo_addresses():
        if _ours(ip):
            subprocess.run(["ip", "addr", "del", f"{ip}/32", "dev", "lo"], capture_output=True)
    made = HOST_MADE.read_text().split() if HOST_MADE.exists() else []
    for point in reversed(made):
        with contextlib.suppress(OSError):
            Path(point).rmdir()


def leftovers() -> list[str]:
    """What node-down's verification adds for cluster-mode nodes."""
    left = [f"cgroup {c}" for c in cgroup_dirs()]
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point in (str(NODE_CDI.resolve()), SELF):
            left.append(f"mount {point}")
    left += [f"address {ip} on lo" for ip in _lo_addresses() if _ours(ip)]
    if (relay := procs.recorded(SERVICE_RELAY)) is not None and relay.alive:
        left.append(f"process {relay.pid} ({SERVICE_RELAY})")
    veths = subprocess.run(["ip", "-o", "route"], capture_output=True, text=True).stdout
    left += [f"route {r.split()[0]}" for r in veths.splitlines() if r.startswith("10.88.")]
    return left


def has_tools(runtime: str = "") -> list[str]:
    need = ["kubelet", "crictl", "pause", "kube-apiserver", "etcd", "kube-controller-manager",
            "kube-scheduler", *(f"cni/{p}" for p in CNI_PLUGINS)]  # fmt: skip
    missing = [n for n in need if not (BIN / n).exists()]
    missing += [t for t in ("unshare", "nsenter") if not shutil.which(t)]
    rt = runtimes.runtime(runtime)
    return missing + [f"{p} ({rt.name}: {rt.fix})" for p in rt.missing()]
