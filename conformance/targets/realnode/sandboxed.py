"""The plugin under test on the real node, run and observed as its profile describes it.

As on the local node, the profile's command runs as is (nothing appended) in a PluginSandbox:
its own mount and network namespaces, zero capabilities and no_new_privs, its hypervisor devices
in a private /dev, and the real node's directories bound where the profile says it looks, as a
DaemonSet's hostPath volumes: the kubelet's plugin dir, containerd's CDI dir and (when it reads
one) the host-device view. Its health is observed the way the profile says (http across the
sandbox's veth, grpc-health on its own socket, exec in its namespaces); without a probe it is
judged on what the kubelet sees. Faults of its own view (its socket dir replaced, its device
remapped or gone from its /dev) are made inside its mount namespace, with the local node's
fault code; each change stamps the time the kubelet's figures must be newer than.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path, PurePosixPath

from hv_device_plugin.api.wire import KUBELET_SOCKET
from hvconform.contract.ledger import mounts_at
from hvconform.contract.node import CAP_LIVENESS, CAP_READINESS
from hvconform.contract.plugin import PluginUnderTest
from hvconform.contract.ran import PluginRan
from hvconform.contract.wait import wait_for
from hvconform.targets.host import binds as binds_mod
from hvconform.targets.host.hostfiles import mount, umount
from hvconform.targets.host.launcher import LAUNCHER
from hvconform.targets.host.netns import free_index
from hvconform.targets.host.sandbox import PluginSandbox
from hvconform.targets.local.faults import LocalFaults
from hvconform.targets.local.observe import Observer
from hvconform.targets.local.plugin_view import SandboxedPluginView
from hvconform.targets.realnode import CDI_DIR, HOST_DEV, NODE_NAME, PLUGIN_DIR, RUN, procs
from hvconform.targets.realnode.freshness import FreshStatus

HEALTH_PORT = 8080  # inside the plugin's own network namespace: no port of this host is taken
# Network-namespace indexes of the real node's sandbox (the local target uses 1..63, the
# sandbox's tests 64 and up by worker, the bench 240..255); a free one is picked at each start.
NET_INDEXES = range(224, 240)
_STAGES = ("/mnt", "/media", "/srv")  # where the launcher may stage a root (as the sandbox)
_ACCEPTING = 0x10000  # __SO_ACCEPTCON in /proc/net/unix: a listening socket
PLUGIN_LOG = procs.LOGS / "plugin.log"


def observed_capabilities(plugin: PluginUnderTest) -> frozenset[str]:
    """Health capabilities: only what the profile gives a way to observe."""
    observed = {CAP_READINESS} if plugin.readiness.observable else set()
    return frozenset(observed | ({CAP_LIVENESS} if plugin.liveness.observable else set()))


def plugin_binds(plugin: PluginUnderTest, sockets: Path = PLUGIN_DIR) -> list[tuple[str, str]]:
    """(node dir, where the plugin looks): the hostPath volumes of its DaemonSet."""
    paths = plugin.paths
    binds = [(str(sockets), paths.device_plugin_dir), (str(CDI_DIR), paths.cdi_dir)]
    if paths.host_dev_dir:
        binds.append((str(HOST_DEV), paths.host_dev_dir))
    return binds


def host_network_argv(plugin: PluginUnderTest, health_addr: str) -> list[str]:
    """The launcher's command line for `start_in_host_network`: the profile's command as is
    after `--`, the node's directories bound where the profile says the plugin looks."""
    binds = plugin_binds(plugin)
    args = [arg for src, dst in binds for arg in ("--bind", f"{src}:{dst}")]
    if binds_mod.needs_new_root([dst for _, dst in binds]):
        stage = next(d for d in _STAGES if Path(d).is_dir() and not Path(d).is_symlink())
        args += ["--stage-root", stage]
    return [
        sys.executable, "-I", str(LAUNCHER), "--private-dev",
        *(a for dev in plugin.paths.devices for a in ("--dev-node", dev)), *args,
        "--drop-caps", "--no-new-privs", "--", *plugin.argv(health_addr),
    ]  # fmt: skip


def start_in_host_network(plugin: PluginUnderTest, health_addr: str) -> procs.Proc:
    """`node-up --plugin`: a plugin for a developer to try the node with, from its profile as
    the node target runs it (its command as is, the node's directories bound where it looks, a
    private /dev, zero capabilities) but in this host's network namespace; recorded, so
    node-down stops it. Returns once its http readiness (if it has one) answers."""
    argv = host_network_argv(plugin, health_addr)
    env = {**os.environ, **plugin.environment(health_addr)}
    proc = procs.start("plugin", argv, env=env, cwd=RUN)
    if plugin.readiness.type == "http":
        ready = Observer(
            plugin, plugin.readiness, health_addr=lambda: health_addr, socket=lambda: None,
            pid=lambda: proc.pid,
        )  # fmt: skip

        def ready_or_dead() -> bool:
            if not proc.alive:
                raise RuntimeError(f"the plugin exited:\n{procs.log_tail('plugin')}")
            return ready()

        wait_for(ready_or_dead, 60, f"plugin readiness ({plugin.readiness.url})", interval=0.2)
    return proc


def make_shared(path: Path) -> None:
    """Make a node mount shared, so a fault mounted over it on the host reaches the plugin's
    slave copy (as on a real node, where /var/lib/kubelet and /run are shared)."""
    subprocess.run(["mount", "--make-shared", str(path)], check=True, capture_output=True)


class SandboxedPlugin(SandboxedPluginView, FreshStatus, LocalFaults):
    """Mixin of RealNode: the plugin half of the Node contract, through a PluginSandbox."""

    plugin: PluginUnderTest
    plugin_dir: Path
    sandbox: PluginSandbox | None
    _faults: set[str]
    _kubelet_log_at: int

    def _init_plugin(self, plugin: PluginUnderTest) -> None:
        self.plugin = plugin
        self.plugin_dir = PLUGIN_DIR
        self.sandbox = None
        self._faults = set()
        self._kubelet_log_at = 0
        self.readiness = self._observer(plugin.readiness)
        self.liveness = self._observer(plugin.liveness)

    # -- start and stop -----------------------------------------------------------------------

    def _start_plugin(self, sockets: Path | None = None) -> None:
        """Start the plugin under test; `sockets` replaces the kubelet's plugin dir (an isolated
        empty one)."""
        self.sandbox = PluginSandbox(
            [],
            run_dir=self.state,
            ledger=self.ledger,
            index=free_index(NET_INDEXES),
            dev_nodes=self.plugin.paths.devices,
            log_path=PLUGIN_LOG,
            http_port=HEALTH_PORT,
            binds=self._binds(sockets or self.plugin_dir),
        )
        addr = self.sandbox.health_addr
        facts = self._facts()
        self.sandbox.argv = self.plugin.argv(addr, facts)
        self.sandbox.env.update(self.plugin.environment(addr, facts))
        self._before_start(self.sandbox)
        self._kubelet_log_at = _size(procs.LOGS / "kubelet.log")
        pid = self.sandbox.start()
        # node-down stops it too, should this run die before its teardown
        procs.record("plugin", pid)

    # -- what a DRA node (dra_node) gives its driver differently ---------------------------------

    def _binds(self, sockets: Path) -> list[tuple[str, str]]:
        return plugin_binds(self.plugin, sockets)

    def _facts(self) -> dict[str, str]:
        """Placeholder values beyond the health address (a DRA driver's credentials)."""
        return {}

    def _before_start(self, sandbox: PluginSandbox) -> None:
        """Called once the sandbox exists, before its plugin is first started."""

    def _stop_plugin(self) -> None:
        """Stop the plugin and verify its sandbox is gone (netns, links, every member)."""
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
            procs.forget("plugin")
        self.touched()  # after the stop: the kubelet sees the old stream close at once

    def _alias_plugin_dir(self) -> None:
        """Give the kubelet's plugin dir a second name of the harness's own, bound before the
        plugin starts: its own path is where the plugin looks, so inside the plugin's mount
        namespace that name is covered (by a shadow, or an empty dir during a fault), and
        restoring the kubelet's dir there needs a name that still reaches it."""
        alias = self.state / "kubelet-plugin-dir"
        alias.mkdir(exist_ok=True)
        below = mounts_at(str(alias))
        mount(["--bind", str(PLUGIN_DIR), str(alias)])
        self.ledger.record("mount", str(alias), f"the kubelet's plugin dir aliased below={below}")
        self.plugin_dir = alias

    def _unalias_plugin_dir(self) -> None:
        if self.plugin_dir != PLUGIN_DIR:
            umount(self.plugin_dir)
            self.plugin_dir = PLUGIN_DIR

    def restart_plugin(self) -> None:
        """The same sandbox (its network namespace kept, as a pod's across container restarts)."""
        if self.sandbox is None:
            self._start_plugin()
            return
        self.sandbox.stop()
        self.touched()
        self.sandbox.start()
        procs.record("plugin", self.sandbox.pid)

    # -- observation ---------------------------------------------------------------------------

    def _plugin_socket(self) -> Path | None:
        """The plugin's own socket, reached through its root (/proc/<pid>/root), so it is
        found wherever its socket dir is bound: the newest listening socket of its network
        namespace in the dir it was told to look in, other than the kubelet's."""
        if not self.plugin_running():
            return None
        pid = self._sandbox().pid
        want = PurePosixPath(self.plugin.paths.device_plugin_dir)
        try:
            table = Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]
        except OSError:
            return None
        found: list[tuple[int, Path]] = []
        for line in table:
            fields = line.split(maxsplit=7)
            if len(fields) < 8 or not int(fields[3], 16) & _ACCEPTING:
                continue
            name = fields[7]
            if name.startswith("@"):
                continue  # abstract: not in the socket dir
            where = Path(f"/proc/{pid}/root") if name.startswith("/") else Path(f"/proc/{pid}/cwd")
            path = PurePosixPath(name)
            if path.name == KUBELET_SOCKET or (path.is_absolute() and path.parent != want):
                continue
            full = where / name.lstrip("/")
            try:
                found.append((full.stat().st_mtime_ns, full))
            except OSError:
                continue  # an old server's socket, already removed
        return max(found)[1] if found else None

    def plugin_log_tail(self, lines: int = 50) -> str:
        return procs.log_tail("plugin", lines)

    def plugin_ran(self) -> PluginRan:
        """What runs as the plugin, and the node's directories bound where it looks."""
        binds = self._sandbox().binds
        return self._ran(
            f"on node {NODE_NAME}",
            *(f"{self._host_name(src)} bound at {dst}" for src, dst in binds),
        )

    def _host_name(self, src: str) -> str:
        return str(PLUGIN_DIR) if src == str(self.plugin_dir) else src  # the alias: its real name

    # -- faults of the plugin's own view: each one stamps the time ----------------------------

    def redirect_plugin_sockets(self, empty: bool) -> None:
        super().redirect_plugin_sockets(empty)
        self.touched()

    def start_plugin_isolated(self) -> None:
        super().start_plugin_isolated()
        self.touched()

    def restore_plugin_sockets(self) -> None:
        super().restore_plugin_sockets()
        self.touched()

    def remap_device_unusable(self, unusable: bool) -> None:
        super().remap_device_unusable(unusable)
        self.touched()

    def set_device_present(self, present: bool) -> None:
        super().set_device_present(present)
        self.touched()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
