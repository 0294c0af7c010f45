"""`nox -s node-up` / `node-down`: the real node as host processes on loopback, and its removal.

up: tmpfs CDI dir and host-device view -> containerd (CDI on, only our CDI dir; own root, state
and socket) -> the offline image -> [etcd -> kube-apiserver -> kube-controller-manager ->
kube-scheduler] -> the kubelet (registered as Node NODE_NAME, or standalone when there is no API
server) -> optionally a plugin from its profile (`--plugin [PROFILE]`, the shipped one by
default; see sandboxed.start_in_host_network). No CNI: workloads are host-network pods.
down: everything in reverse, by recorded pid; pod sandboxes removed through CRI; then mounts,
directories, the kubelet's cgroups and log dirs; finally `verify_down` lists anything left.

The roots (its state, run dir and /var/lib/kubelet) are taken whole and removed whole, so up
marks each one it makes (ROOT_MARK) and refuses one that exists unmarked: a /var/lib/kubelet
that was there before (another kubelet's, with its pods' volumes mounted below) is never used,
unmounted or removed. A stack of a node-up from before the marks is recognised as its own.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from hvconform.contract.runtime_facts import RuntimeFacts, from_crictl
from hvconform.targets.realnode import (
    API_PORT,
    BIN,
    CDI_DIR,
    CONTAINERD_SOCKET,
    ETCD_CLIENT_PORT,
    ETCD_PEER_PORT,
    HOST_DEV,
    KUBELET_ROOT,
    NODE_NAME,
    RUN,
    SERVICE_CIDR,
    STATE,
    hostclean,
    nodes,
    procs,
    runtimes,
)
from hvconform.targets.realnode.configs import (
    KUBELET_HEALTHZ,
    PKI,
    ContainerdPaths,
    containerd_config,
    containerd_config_v3,
    kubelet_config,
)
from hvconform.targets.realnode.image import import_image
from hvconform.targets.realnode.kubeapi import Api, ApiError
from hvconform.targets.realnode.pki import kubeconfig, make_pki
from hvconform.targets.realnode.runtimes import NodeRuntime

# node-up --plugin only: the node target's plugin has a network namespace of its own
PLUGIN_HEALTH = "127.0.0.1:18080"
LOG_DIRS = (Path("/var/log/pods"), Path("/var/log/containers"))
ROOTS = (RUN, STATE, KUBELET_ROOT)
ROOT_MARK = ".hv-node-root"  # in each root node-up made: node-down removes only a marked root
ORDER = ("plugin", "kubelet", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")


def _wait(pred: object, timeout_s: float, what: str, proc: procs.Proc | None = None) -> None:
    assert callable(pred)
    deadline = time.monotonic() + timeout_s
    while not pred():
        if proc is not None and not proc.alive:
            raise RuntimeError(
                f"{proc.name} exited while waiting for {what}:\n{procs.log_tail(proc.name)}"
            )
        if time.monotonic() > deadline:
            tail = procs.log_tail(proc.name) if proc else ""
            raise RuntimeError(f"timed out after {timeout_s:g}s waiting for {what}\n{tail}")
        time.sleep(0.2)


def _marked(root: Path) -> bool:
    return not root.is_symlink() and (root / ROOT_MARK).is_file()


def _legacy() -> bool:
    """The state of a node-up from before the marks: every root was its own."""
    return (RUN / "log-dirs-made").exists() and not _marked(RUN)


def roots_refused() -> str:
    """'' when node-up may take every root (absent, or made by node-up); else why not."""
    foreign = [r for r in ROOTS if os.path.lexists(r) and not (_marked(r) or _legacy())]
    return "" if not foreign else (
        f"{foreign[0]} exists and node-up did not make it (another kubelet's?): the node stack "
        "takes it whole and node-down removes it, so it is left alone; move it away or use a "
        "machine without one"
    )  # fmt: skip


def own_roots() -> tuple[Path, ...]:
    """The roots node-down may unmount below and remove: the ones node-up made."""
    legacy = _legacy()
    return tuple(root for root in ROOTS if legacy or _marked(root))


def _make_roots() -> None:
    if why := roots_refused():
        raise RuntimeError(why)
    for root in ROOTS:
        root.mkdir(parents=True, exist_ok=True)
        (root / ROOT_MARK).write_text("made by node-up: node-down removes this directory\n")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 (loopback http only)
            return bool(resp.status == 200)
    except OSError:
        return False


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if not os.path.ismount(path):
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "hv-node", str(path)],
            check=True,
        )


def _start_containerd(rt: NodeRuntime) -> None:
    (RUN / "containerd").mkdir(parents=True, exist_ok=True)
    (RUN / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
    cfg = RUN / "containerd" / "config.toml"
    text = (
        containerd_config_v3(
            runc=rt.binary("runc"), cdi=rt.cdi, paths=ContainerdPaths(cdi_dir=rt.cdi_dir(CDI_DIR))
        )
        if rt.config_version == 3
        else containerd_config()
    )
    cfg.write_text(text)
    argv = [rt.binary("containerd"), "--config", str(cfg)]
    proc = procs.start("containerd", argv, env=rt.env())
    _wait(lambda: CONTAINERD_SOCKET.exists(), 30, "containerd's socket", proc)
    _wait(lambda: _crictl("info", check=False).returncode == 0, 30, "containerd's CRI", proc)
    import_image(RUN)


def crictl_argv() -> list[str]:
    """crictl on our containerd, with a config file of ours (none is read from /etc)."""
    config = RUN / "crictl.yaml"
    if not config.exists():
        config.write_text(f"runtime-endpoint: unix://{CONTAINERD_SOCKET}\ntimeout: 20\n")
    return [str(BIN / "crictl"), "--config", str(config)]


def _crictl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*crictl_argv(), *args], capture_output=True, text=True, check=check, timeout=120
    )


def runtime_facts() -> RuntimeFacts:
    """The node's containerd as it says it runs (its version, its CDI configuration)."""
    version, info = _crictl("version", check=False), _crictl("info", check=False)
    for asked in (version, info):
        if asked.returncode != 0:
            raise RuntimeError(f"{' '.join(asked.args[-1:])}: {asked.stderr.strip()[-300:]}")
    return from_crictl(version.stdout, info.stdout, f"crictl on {CONTAINERD_SOCKET}")


def _start_control_plane(controllers: str = "*,-nodelifecycle") -> Api:
    """etcd, the API server, the controller manager and the scheduler. Cluster-mode nodes run
    every controller: node lifecycle lifts the not-ready taint DaemonSet pods do not tolerate."""
    make_pki(PKI)
    etcd = procs.start("etcd", [
        str(BIN / "etcd"), "--name", NODE_NAME, "--data-dir", str(STATE / "etcd"),
        "--listen-client-urls", f"http://127.0.0.1:{ETCD_CLIENT_PORT}",
        "--advertise-client-urls", f"http://127.0.0.1:{ETCD_CLIENT_PORT}",
        "--listen-peer-urls", f"http://127.0.0.1:{ETCD_PEER_PORT}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{ETCD_PEER_PORT}",
        "--initial-cluster", f"{NODE_NAME}=http://127.0.0.1:{ETCD_PEER_PORT}",
        "--unsafe-no-fsync",
    ])  # fmt: skip
    _wait(lambda: _http_ok(f"http://127.0.0.1:{ETCD_CLIENT_PORT}/health"), 60, "etcd health", etcd)
    api = procs.start("kube-apiserver", [
        str(BIN / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}",
        "--bind-address=127.0.0.1", f"--secure-port={API_PORT}", "--advertise-address=127.0.0.1",
        "--endpoint-reconciler-type=none", f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--tls-cert-file={PKI / 'apiserver.crt'}", f"--tls-private-key-file={PKI / 'apiserver.key'}",
        f"--client-ca-file={PKI / 'ca.crt'}", "--authorization-mode=Node,RBAC",
        f"--kubelet-client-certificate={PKI / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={PKI / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={PKI / 'ca.crt'}", "--kubelet-preferred-address-types=InternalIP",
        f"--service-account-key-file={PKI / 'sa.pub'}",
        f"--service-account-signing-key-file={PKI / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc", "--profiling=false",
        "--allow-privileged=true",  # as kubeadm, kind and AKS: node access by diagnostic pod
    ])  # fmt: skip
    client = Api(PKI)
    _wait(client.ready, 120, "kube-apiserver /readyz", api)
    for name in ("kube-controller-manager", "kube-scheduler"):
        if not (BIN / name).exists():
            continue  # optional: pods name their node; the default service account is made below
        cfg = kubeconfig(PKI, "admin", RUN / f"{name}.kubeconfig")
        extra = [
            f"--controllers={controllers}",
            "--use-service-account-credentials=false",
            f"--service-account-private-key-file={PKI / 'sa.key'}",
            f"--root-ca-file={PKI / 'ca.crt'}",
        ]
        argv = [
            str(BIN / name),
            f"--kubeconfig={cfg}",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
        ]
        procs.start(name, [*argv, *(extra if name == "kube-controller-manager" else [])])
    try:
        client.request("POST", "/api/v1/namespaces/default/serviceaccounts", {
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})  # fmt: skip
    except ApiError as exc:
        if exc.status != 409:
            raise
    return client


def start_kubelet(api: Api | None) -> procs.Proc:
    proc = spawn_kubelet(api)
    wait_kubelet(proc, api)
    return proc


def spawn_kubelet(api: Api | None) -> procs.Proc:
    """The kubelet process started, not waited on (a reboot starts the plugin meanwhile)."""
    (RUN / "manifests").mkdir(parents=True, exist_ok=True)
    cfg = RUN / "kubelet.yaml"
    cfg.write_text(kubelet_config())
    argv = [
        str(BIN / "kubelet"), f"--config={cfg}", f"--hostname-override={NODE_NAME}",
        "--node-ip=127.0.0.1", f"--root-dir={KUBELET_ROOT}", "--v=2",
    ]  # fmt: skip
    if api is not None:
        argv.append(f"--kubeconfig={kubeconfig(PKI, 'kubelet', RUN / 'kubelet.kubeconfig')}")
    return procs.start("kubelet", argv)


def wait_kubelet(proc: procs.Proc, api: Api | None) -> None:
    """Until the kubelet answers its healthz and (with an API server) its Node exists."""
    _wait(
        lambda: _http_ok(f"http://127.0.0.1:{KUBELET_HEALTHZ}/healthz"), 90, "kubelet healthz", proc
    )
    if api is not None:
        _wait(lambda: _node_exists(api), 60, f"Node {NODE_NAME} registered", proc)


def _node_exists(api: Api) -> bool:
    try:
        api.get(f"/api/v1/nodes/{NODE_NAME}")
    except (ApiError, OSError):
        return False
    return True


def up(*, standalone: bool = False, runtime: str = "") -> Api | None:
    """The node on this machine; `runtime`: which containerd it runs (realnode.runtimes)."""
    missing = [n for n in ("kubelet", "crictl", "pause") if not (BIN / n).exists()]
    if missing:
        raise RuntimeError(f"not built: {', '.join(missing)} (run `nox -s node-build`)")
    rt = runtimes.runtime(runtime)
    if absent := rt.missing():
        raise RuntimeError(f"{rt.name}: {', '.join(absent)} not found ({rt.fix})")
    alive = [n for n in (*ORDER, "containerd") if (p := procs.recorded(n)) and p.alive]
    if alive:
        raise RuntimeError(f"node already up ({', '.join(alive)} running): run node-down first")
    with_api = not standalone and (BIN / "kube-apiserver").exists() and (BIN / "etcd").exists()
    _make_roots()
    (RUN / "log-dirs-made").write_text("\n".join(str(d) for d in LOG_DIRS if not d.exists()) + "\n")
    _mount_tmpfs(CDI_DIR, "4m")
    _mount_tmpfs(HOST_DEV, "1m")
    kvm = os.stat("/dev/kvm").st_rdev
    if not (HOST_DEV / "kvm").exists():
        os.mknod(HOST_DEV / "kvm", 0o020660, kvm)
    make_pki(PKI)  # the kubelet's client CA, even standalone
    _start_containerd(rt)
    api = _start_control_plane() if with_api else None
    start_kubelet(api)
    return api


def up_nodes(count: int, runtime: str = "") -> Api:
    """Cluster mode: the control plane, then `count` kubelets each in a node of its own (nodes),
    each on `runtime`'s containerd (realnode.runtimes)."""
    if not 1 <= count <= nodes.MAX_NODES:
        raise RuntimeError(f"--nodes must be 1..{nodes.MAX_NODES}, got {count}")
    rt = runtimes.runtime(runtime)
    if missing := nodes.has_tools(runtime):
        raise RuntimeError(f"not built or not installed: {', '.join(missing)} (nox -s node-build)")
    alive = [n for n in (*ORDER, "containerd") if (p := procs.recorded(n)) and p.alive]
    if alive or nodes.recorded_nodes():
        raise RuntimeError("node already up: run node-down first")
    _make_roots()
    (RUN / "log-dirs-made").write_text("\n".join(str(d) for d in LOG_DIRS if not d.exists()) + "\n")
    nodes.NODES_RUN.mkdir(parents=True, exist_ok=True)
    nodes.prepare_host()
    api = _start_control_plane(controllers="*")
    nodes.start_service_relay()
    chosen = nodes.layouts(count)
    for node in chosen:
        nodes.start_node(node, rt)
    kubeconfig(PKI, "admin", nodes.ADMIN_KUBECONFIG)
    nodes.wait_nodes_ready(api, chosen)
    return api


def mounts_under(roots: tuple[Path, ...]) -> list[str]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == str(r) or point.startswith(str(r) + "/") for r in roots):
            found.append(point)
    return found


def down() -> list[str]:
    """Stop and remove everything node-up made; returns what could not be removed."""
    roots = own_roots()  # first: RUN holds the marks of the legacy check
    nodes.stop_nodes()  # cluster-mode nodes first: each removes its own pods
    for name in ORDER[:2]:
        if (p := procs.recorded(name)) is not None:
            p.stop()
    if (p := procs.recorded("containerd")) is not None and p.alive:
        _crictl("rmp", "-af", check=False)
        p.stop()
    sock = str(CONTAINERD_SOCKET)
    for pid in procs.pids_with_arg(sock) + procs.pids_with_exe_under(STATE):
        if (st := procs.start_time(pid)) is not None:
            procs.Proc("leftover", pid, st).stop(timeout_s=5)
    for name in ORDER[2:]:
        if (p := procs.recorded(name)) is not None:
            p.stop()
    for point in sorted(mounts_under(roots), key=len, reverse=True):
        if subprocess.run(["umount", point], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True)
    made = (RUN / "log-dirs-made").read_text().split() if (RUN / "log-dirs-made").exists() else []
    for d in made:
        shutil.rmtree(d, ignore_errors=True)
    nodes.remove_host_leftovers()
    # RUN last: it holds the marks
    problems = [why for root in reversed(roots) if (why := hostclean.remove_root(root))]
    for cg in hostclean.kubepods_cgroups():
        with contextlib.suppress(OSError):
            hostclean.rm_cgroup(cg)
    hostclean.remove_iptables_leftovers()
    # with what stopped a root's removal (a CI run once saw "directory /var/lib/kubelet" only)
    return verify_down(roots) + problems


def verify_down(roots: tuple[Path, ...] | None = None) -> list[str]:
    """What is left of a stack; `roots`: the ones node-up made (own_roots() before down)."""
    left = [f"process {pid} ({Path(f'/proc/{pid}/exe').resolve()})"
            for pid in procs.pids_with_exe_under(BIN) + procs.pids_with_exe_under(STATE)]  # fmt: skip
    left += [f"containerd shim {pid}" for pid in procs.pids_with_arg(str(CONTAINERD_SOCKET))]
    roots = own_roots() if roots is None else roots  # one node-up did not make is not its
    left += [f"mount {m}" for m in mounts_under(roots)]
    left += [f"directory {r}" for r in roots if r.exists()]
    left += [f"cgroup {c}" for c in hostclean.kubepods_cgroups()]
    left += [
        f"{tool} -t {table} chain {chain}" for tool, table, chain in hostclean.iptables_leftovers()
    ]
    return left + nodes.leftovers()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hv-node", description="the real node: up or down")
    parser.add_argument("action", choices=("up", "down", "verify-down"))
    parser.add_argument("--standalone", action="store_true", help="kubelet without an API server")
    parser.add_argument("--plugin", nargs="?", const="", metavar="PROFILE",
                        help="also run a plugin from its profile (default: the shipped one)")  # fmt: skip
    parser.add_argument(
        "--nodes", type=int, default=0, help="cluster mode: this many nodes of their own (1..8)"
    )
    parser.add_argument(
        "--node-runtime",
        choices=list(runtimes.RUNTIMES),
        default="",
        help="the containerd the node(s) run (default: containerd-1.7)",
    )
    args = parser.parse_args(argv)
    start = time.monotonic()
    if args.action == "up":
        if args.plugin is not None:  # the profile needs the conformance extras; node-up does not
            from hvconform.contract.plugin import SHIPPED, ProfileError, load_profile
            from hvconform.targets.realnode.sandboxed import start_in_host_network

            try:
                plugin = load_profile(args.plugin or SHIPPED)
            except ProfileError as exc:
                print(f"node-up: {exc}", file=sys.stderr)
                return 2
        try:
            api = (
                up_nodes(args.nodes, args.node_runtime)
                if args.nodes
                else up(standalone=args.standalone, runtime=args.node_runtime)
            )
            if args.plugin is not None and not args.nodes:
                start_in_host_network(plugin, PLUGIN_HEALTH)
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            print(f"node-up: FAILED: {exc}", file=sys.stderr)
            if "already up" not in str(exc):
                left = down()  # roll back what was started; a running node is left alone
                print(f"node-up: rolled back ({left or 'clean'})", file=sys.stderr)
            return 1
        mode = "standalone kubelet" if api is None else f"API server https://127.0.0.1:{API_PORT}"
        if args.nodes:
            names = ", ".join(n.name for n in nodes.layouts(args.nodes))
            mode += f"; nodes {names}; kubeconfig {nodes.ADMIN_KUBECONFIG}"
        print(
            f"node-up: {NODE_NAME} up in {time.monotonic() - start:.1f}s ({mode}); logs in {procs.LOGS}"
        )
        return 0
    left = down() if args.action == "down" else verify_down()
    for item in left:
        print(f"node-down: left behind: {item}", file=sys.stderr)
    print(
        f"node-{args.action}: {'clean' if not left else 'NOT clean'} in {time.monotonic() - start:.1f}s"
    )
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
