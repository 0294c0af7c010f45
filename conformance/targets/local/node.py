"""The local node target: a node on this machine, no cluster.

A per-worker node root holds the kubelet plugin dir, a tmpfs CDI dir and a tmpfs host-device view
whose kvm node is made with mknod from the real /dev/kvm's numbers. The kubelet is the emulator;
the plugin runs in a sandbox (zero capabilities, no_new_privs, its own mount and network
namespaces); workloads run through a CDI-resolving runtime emulation. The node root is a shared
mount and the plugin's namespace a slave of it, so storage faults made here reach the plugin as
they would through a hostPath, while faults inside the plugin's namespace stay there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hv_device_plugin.api.wire import KUBELET_SOCKET
from hvconform.contract.base import set_up
from hvconform.contract.node import (
    CAP_DEVICE_LATE,
    CAP_DEVICE_REMAP,
    CAP_DEVICE_VIEW,
    CAP_GUEST,
    CAP_KUBELET_CRASH,
    CAP_KUBELET_RESTART,
    CAP_LIVENESS,
    CAP_LONG_GUEST,
    CAP_NODE_REBOOT,
    CAP_PLUGIN_OPTIONS,
    CAP_PLUGIN_RESTART,
    CAP_POD_DEVICE_HEALTH,
    CAP_PODS,
    CAP_PRE_START,
    CAP_PREFERRED_ALLOCATION,
    CAP_READ_ONLY,
    CAP_READ_STORM,
    CAP_READINESS,
    CAP_SOCKET_REDIRECT,
    CAP_STREAM_END,
)
from hvconform.contract.plugin import PluginUnderTest
from hvconform.contract.ran import PluginRan
from hvconform.contract.results import EnvironmentBlocked
from hvconform.contract.runcontext import RunContext
from hvconform.contract.wait import wait_for
from hvconform.kubelet import ThreadedKubeletEmulator
from hvconform.kubelet.accounting import EventKind
from hvconform.targets.host.hostfiles import device_metadata, mount, umount
from hvconform.targets.host.netns import free_index
from hvconform.targets.host.sandbox import PluginSandbox
from hvconform.targets.local.baseline import BaselineRestore
from hvconform.targets.local.evidence import LocalEvidence
from hvconform.targets.local.faults import LocalFaults
from hvconform.targets.local.liveness import kubelet_live
from hvconform.targets.local.plan import command_line, machine_plan
from hvconform.targets.local.plugin_view import SandboxedPluginView
from hvconform.targets.local.pods import LocalPods, LocalRuntime
from hvconform.targets.local.reboot import LocalNodeFaults
from hvconform.targets.local.workloads import LocalWorkloads

HEALTH_PORT = 8080
SETUP_TIMEOUT_S = 60.0


def _check_environment() -> None:
    if os.geteuid() != 0:
        raise EnvironmentBlocked("the local target needs root (mknod, mounts, namespaces)")
    try:
        st = os.stat("/dev/kvm")
    except OSError as exc:
        raise EnvironmentBlocked(f"/dev/kvm unavailable: {exc.strerror}") from None
    if not stat.S_ISCHR(st.st_mode):
        raise EnvironmentBlocked("/dev/kvm is not a character device")


BASE_CAPABILITIES = frozenset(
    {
        CAP_KUBELET_RESTART,
        CAP_KUBELET_CRASH,
        CAP_PLUGIN_RESTART,
        CAP_READ_ONLY,
        CAP_DEVICE_VIEW,
        CAP_DEVICE_REMAP,
        CAP_SOCKET_REDIRECT,
        CAP_GUEST,
        CAP_LONG_GUEST,
        CAP_READ_STORM,
    }
)


# What the kubelet emulator models of pods and whole-node faults, with the guests as containers:
# only for the process runtime (the container runtime's workloads are podman's, not modelled).
WORKLOAD_CAPABILITIES = frozenset(
    {CAP_PODS, CAP_NODE_REBOOT, CAP_DEVICE_LATE, CAP_STREAM_END, CAP_POD_DEVICE_HEALTH}
)


def _capabilities(plugin: PluginUnderTest, runtime: str = "process") -> frozenset[str]:
    """What this node can do with this plugin: health only where the profile can observe it."""
    observed = {CAP_READINESS} if plugin.readiness.observable else set()
    # Liveness is always observable here: the process (kubelet_live), and the profile's
    # liveness probe on top when it names one.
    observed |= {CAP_LIVENESS}
    workloads = WORKLOAD_CAPABILITIES if runtime == "process" else frozenset()
    return BASE_CAPABILITIES | observed | workloads


class LocalNode(
    BaselineRestore,
    SandboxedPluginView,
    LocalFaults,
    LocalWorkloads,
    LocalPods,
    LocalNodeFaults,
    LocalEvidence,
):
    name = "local"
    runtime = "process"  # the container runtime's node says "container"

    def __init__(self, *, out_dir: Path, worker: str, plugin: PluginUnderTest) -> None:
        self._init_host_node(out_dir, worker, "")
        self.plugin = plugin
        self.resource = plugin.resource or ""
        self.spec_name = plugin.cdi_spec or ""
        self.capabilities = _capabilities(plugin, self.runtime)
        self._faults: set[str] = set()
        self.readiness = self._observer(plugin.readiness)
        self.liveness = self._observer(plugin.liveness)
        self._mounts: list[Path] = []
        self._guests: dict[str, subprocess.Popen[bytes]] = {}
        self._guest_runs = 0
        self._allocations: dict[int, Any] = {}
        self.sandbox: PluginSandbox | None = None
        self.kubelet: ThreadedKubeletEmulator | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def setup(self) -> None:
        _check_environment()
        self.host_metadata_at_start = device_metadata("/dev/kvm")
        # Short on purpose: unix socket paths must fit in 107 bytes.
        self.root = Path(tempfile.mkdtemp(prefix=f"hvn-{self.worker}-", dir="/tmp"))
        self.ledger.record("dir", str(self.root), "node root")
        self._mount(["--bind", str(self.root), str(self.root)], self.root)
        subprocess.run(["mount", "--make-rshared", str(self.root)], check=True)
        self.plugin_dir = self.root / "kubelet" / "device-plugins"
        self.state = self.root / "state"
        super().__init__(self.root / "cdi", self.root / "host-dev")
        for d in (self.plugin_dir, self.state, self.dirs["cdi"], self.dirs["host_dev"]):
            d.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # workloads run as 65534 and must reach their state dir
        self.state.chmod(0o755)
        self.guest_dir = self.state / "guests"
        self.guest_dir.mkdir()
        os.chown(self.guest_dir, 65534, 65534)
        # /var/run/cdi lives on tmpfs on real nodes; the host-device view is a devtmpfs stand-in.
        self._mount(
            ["-t", "tmpfs", "-o", "size=4m,mode=0755", "hv-cdi", str(self.dirs["cdi"])],
            self.dirs["cdi"],
        )
        self._mount(
            ["-t", "tmpfs", "-o", "size=1m,mode=0755", "hv-dev", str(self.dirs["host_dev"])],
            self.dirs["host_dev"],
        )
        kvm = os.stat("/dev/kvm")
        self.make_char_device("host_dev", "kvm", os.major(kvm.st_rdev), os.minor(kvm.st_rdev))
        for name, data in self.sentinels.items():
            self.write_file("cdi", name, data)
        self.kubelet = ThreadedKubeletEmulator(self.plugin_dir)
        if CAP_PODS in self.capabilities:
            self.kubelet.attach_runtime(LocalRuntime(self))  # the guests are its containers
        self.kubelet.start()
        self._start_plugin()
        self.resource = self.resource or wait_for(
            self._registered_resource, SETUP_TIMEOUT_S, "the plugin's Register call at node setup"
        )
        wait_for(self._ready_or_dead, SETUP_TIMEOUT_S, "plugin ready at node setup")
        wait_for(lambda: self.allocatable() > 0, SETUP_TIMEOUT_S, "allocatable > 0 at node setup")
        options = self._kubelet().emulator.options(self.resource)
        if options is not None:
            self.capabilities |= {CAP_PLUGIN_OPTIONS}
        if options is not None and options.get_preferred_allocation_available:
            self.capabilities |= {CAP_PREFERRED_ALLOCATION}
        if options is not None and options.pre_start_required:
            self.capabilities |= {CAP_PRE_START}
        allocation = wait_for(
            lambda: (a := self.allocate()).ok and a, SETUP_TIMEOUT_S, "an Allocate at node setup"
        )
        self._take_baseline(allocation, SETUP_TIMEOUT_S)

    def _start_plugin(self, sockets: Path | None = None) -> None:
        """Start the plugin under test (a hook: the container runtime runs it differently).

        The node's directories are bound where the profile says the plugin looks, as hostPath
        volumes; `sockets` replaces the kubelet's plugin dir (an isolated empty one)."""
        paths = self.plugin.paths
        binds = [
            (str(sockets or self.plugin_dir), paths.device_plugin_dir),
            (str(self.dirs["cdi"]), paths.cdi_dir),
        ]
        if paths.host_dev_dir:
            binds.append((str(self.dirs["host_dev"]), paths.host_dev_dir))
        self.sandbox = PluginSandbox(
            [],
            run_dir=self.state,
            ledger=self.ledger,
            index=_net_index(self.worker),
            dev_nodes=paths.devices,
            log_path=self.root / "plugin.log",
            http_port=HEALTH_PORT,
            binds=binds,
        )
        addr = self.sandbox.health_addr
        self.sandbox.argv = self.plugin.argv(addr)
        self.sandbox.env.update(self.plugin.environment(addr))
        self.sandbox.start()

    def _stop_plugin(self) -> None:
        """Stop the plugin and verify it is gone (the hook paired with _start_plugin)."""
        if self.sandbox is not None:
            self.sandbox.close()

    def teardown(self) -> None:
        for handle, proc in list(self._guests.items()):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
            self._guests.pop(handle)
        self._stop_plugin()
        if self.kubelet is not None:
            self.kubelet.stop()
        for mountpoint in reversed(self._mounts):
            umount(mountpoint)
        self._mounts.clear()
        if hasattr(self, "root"):
            shutil.copy2(self.root / "plugin.log", self.out_dir / f"plugin-{self.worker}.log") if (
                self.root / "plugin.log"
            ).exists() else None
            shutil.rmtree(self.root, ignore_errors=False)

    def _mount(self, args: list[str], mountpoint: Path) -> None:
        mount(args)
        self._mounts.append(mountpoint)
        self.ledger.record("mount", str(mountpoint))

    # -- the plugin -------------------------------------------------------------------------

    def _plugin_socket(self) -> Path | None:
        """The plugin's own socket: its registered endpoint, or (while it is kept from the
        kubelet's dir) the newest socket it made where it was told to look."""
        ok = [r for r in self._kubelet().registrations(self.resource) if r.ok]
        where = [self.state / "isolated-sockets"] if "isolated" in self._faults else []
        where += [self.state / "empty-sockets"] if "sockets" in self._faults else []
        socks = [p for d in where if d.is_dir() for p in d.iterdir() if p.is_socket()]
        socks = [p for p in socks if p.name != KUBELET_SOCKET]
        if ok and (self.plugin_dir / ok[-1].endpoint).exists():
            socks.append(self.plugin_dir / ok[-1].endpoint)
        return max(socks, key=lambda p: p.stat().st_mtime_ns) if socks else None

    def _registered_resource(self) -> str | None:
        if not self.plugin_running():
            raise RuntimeError(f"the plugin exited during node setup:\n{self.plugin_log_tail(20)}")
        names = self._kubelet().registered_resources()
        return names[0] if names else None

    def _ready_or_dead(self) -> bool:
        if not self._sandbox().running:
            raise RuntimeError(f"the plugin exited during node setup:\n{self.plugin_log_tail(20)}")
        # Without an observable readiness, the kubelet's view is the readiness.
        return self.plugin_ready() if self.readiness.observable else self.allocatable() > 0

    def restart_plugin(self) -> None:
        self._sandbox().restart()

    def plugin_live(self) -> bool:
        """As the kubelet judges it: the process runs and its liveness probe (if any) did not
        fail three times in a row, 10 s apart; readiness plays no part (local/liveness.py)."""
        probe = self.liveness if self.liveness.observable else None
        return kubelet_live(self.plugin_running, probe)

    def plugin_ran(self) -> PluginRan:
        return self._ran("on this machine")

    def plugin_log_tail(self, lines: int = 50) -> str:
        log = self.root / "plugin.log"
        return (
            "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""
        )

    # -- the kubelet ------------------------------------------------------------------------

    def _kubelet(self) -> ThreadedKubeletEmulator:
        assert self.kubelet is not None
        return self.kubelet

    def restart_kubelet(self, graceful: bool) -> float:
        kubelet = self._kubelet()
        kubelet.restart(graceful)
        # The kubelet's own "listening" time, not the moment this thread got control back: on a
        # busy machine the plugin may register before then, and that registration must count.
        started = kubelet.emulator.started_at
        assert started is not None, "the emulator restarted but recorded no start time"
        return started

    def last_registration_at(self) -> float | None:
        ok = [r.t for r in self._kubelet().registrations(self.resource) if r.ok]
        return max(ok) if ok else None

    def listed_healthy(self, since: float) -> str:
        """The emulator's record of the plugin's latest ListAndWatch list (the restore's
        hook): every device of node setup in it, all healthy, sent at or after `since`."""
        lists = self._kubelet().timeline(EventKind.SNAPSHOT, self.resource)
        if not lists or lists[-1].t < since:
            return "the plugin sent no ListAndWatch list since the restore undid the fault"
        d = lists[-1].detail
        healthy, unhealthy = int(str(d.get("healthy", 0))), int(str(d.get("unhealthy", 0)))
        if unhealthy or healthy != self.baseline_capacity:
            return (
                f"the plugin's latest ListAndWatch list has {healthy} healthy and {unhealthy} "
                f"unhealthy devices (at node setup: {self.baseline_capacity} healthy)"
            )
        return ""

    def capacity(self) -> int:
        return self._kubelet().capacity(self.resource)

    def allocatable(self) -> int:
        return self._kubelet().allocatable(self.resource)


def _net_index(worker: str) -> int:
    # Indexes 1..63 are the local target's (the sandbox's own tests use 64 and up); a free one
    # is picked so concurrent runs do not clash (creation is the real claim and fails loudly).
    digits = int("".join(ch for ch in worker if ch.isdigit()) or 0)
    start = 1 + (digits * 7 + os.getpid()) % 63
    return free_index([1 + (start + i) % 63 for i in range(63)])


@contextlib.contextmanager
def open_node(
    ctx: RunContext, *, worker: str, metadata: object | None = None
) -> Iterator[LocalNode]:
    """The registry's entry: a local node for one worker, always torn down."""
    with set_up(LocalNode(out_dir=ctx.out, worker=worker, plugin=ctx.plugin)) as node:
        yield node


def plan_text(options: Any, plugin: Any) -> str:
    """--dry-run: what a run on this target would start, make and remove."""
    return machine_plan(
        "--target local --runtime process",
        plugin,
        [
            "a node root per worker, /tmp/hvn-<worker>-*, bind-mounted rshared: the kubelet's "
            "plugin dir, a tmpfs CDI dir (4 MiB) and a tmpfs host-device view (1 MiB) with a "
            "kvm node made by mknod from /dev/kvm's numbers",
            "the kubelet: the suite's emulator of the device plugin API, its socket in that "
            "plugin dir",
            f"the plugin: {command_line(plugin)}, in a sandbox (zero capabilities, "
            "no_new_privs, its own mount and network namespaces), the node's directories bound "
            "where its profile's paths say",
            "workloads: the suite's guest as sandboxed processes, given what the CDI spec "
            "declares for the device allocated",
        ],
        ["the plugin stopped, each mount and the node root removed, each verified (the ledger)"],
    )
