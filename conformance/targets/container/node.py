"""The local node target with real container runtimes (`--runtime container`).

The node is LocalNode's (node root, tmpfs CDI dir and host-device view, kubelet emulator, the
same faults); what changes is who runs the plugin and the workloads:
- the plugin is the profile's deploy.image, run by the Docker engine as the profile's objects
  describe its container (targets.container.spec: command, args, env, user, mounts), with the
  node's directories bound at the profile's paths, the profile's devices passed, and the
  harness's fixed hardening (no capabilities, no-new-privileges, no network); faults inside its
  mount namespace go through targets.container.nsops, health through the profile's probes
  (http in the container's network namespace, grpc-health on its socket, exec in its
  namespaces). This repository's own image is built from this tree and carries the shipped
  profile's tag; any other image must already be in the engine (nothing is ever pulled);
- workloads run under podman from the guest image's filesystem and get the device ONLY through
  CDI (`--device <kind>=<name>`) resolved from the spec the plugin wrote, as uid/gid 65534
  (targets.podman). A negative control at setup (no CDI device) must fail.
results.json gets, per worker (targets.target_report): the image IDs, the plugin container as
derived from the objects, each plugin container's inspection with CapEff from /proc/<pid>/status,
the objects' exec probes run once, and every guest run with the CDI name that injected its device;
what really ran is read back by the suite (plugin_ran: the engine's image ID, Path and Args, and
/proc/<pid>/cmdline).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import docker

from hv_device_plugin.api.names import default_plugin_image
from hvconform.contract.base import set_up
from hvconform.contract.plugin import PluginUnderTest, Probe
from hvconform.contract.ran import PluginRan
from hvconform.contract.results import EnvironmentBlocked
from hvconform.contract.runcontext import RunContext
from hvconform.contract.target_options import LocalOptions
from hvconform.contract.target_report import TargetReport
from hvconform.targets.container.engine import DockerEngine, EngineError
from hvconform.targets.container.images import (
    ImageSet,
    ensure_images,
    export_rootfs,
    image_config,
)
from hvconform.targets.container.plugin_container import (
    Bind,
    PluginContainer,
    PluginContainerError,
)
from hvconform.targets.container.podman import PodmanRuntime
from hvconform.targets.container.spec import ContainerSpec, container_spec
from hvconform.targets.container.workloads import KVM, ContainerWorkloads
from hvconform.targets.local.node import LocalNode
from hvconform.targets.local.observe import PROBE_TIMEOUT_S, Observer
from hvconform.targets.local.plan import machine_plan

TOOLS = ("dockerd", "containerd", "podman", "crun", "unshare", "nsenter", "debootstrap")


def _check_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise EnvironmentBlocked(
            f"--runtime container needs {', '.join(missing)}: scripts/bootstrap installs them"
        )


class _ContainerObserver(Observer):
    """The profile's probe against the plugin container: http in its network namespace (it has
    no other network), exec through the engine (as a kubelet's exec probe: the container's env,
    user and confinement), grpc-health on its socket as for the sandbox."""

    def __init__(self, node: ContainerNode, probe: Probe) -> None:
        super().__init__(
            node.plugin, probe, health_addr=node.health_addr, socket=node._plugin_socket,
            pid=lambda: node._container().pid,
        )  # fmt: skip
        self.node = node

    def _http(self) -> bool:
        url = urlsplit(self.plugin.fill(self.probe.url, self._health_addr()))
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        try:
            container = self.node._container()
            status, _ = container.http_get(
                url.port or 80, path, PROBE_TIMEOUT_S, host=url.hostname or ""
            )
        except (OSError, ValueError, PluginContainerError):
            return False
        return 200 <= status < 400

    def _exec(self) -> bool:
        argv = [self.plugin.fill(a, self._health_addr()) for a in self.probe.command]
        try:
            code, _ = self.node._container().exec(argv, timeout=PROBE_TIMEOUT_S * 5)
        except PluginContainerError:
            return False
        return code == 0


class ContainerNode(ContainerWorkloads, LocalNode):
    """LocalNode with the plugin under Docker, as its profile's objects say, and the workloads
    under podman."""

    runtime = "container"

    def __init__(
        self, *, out_dir: Path, worker: str, plugin: PluginUnderTest, docker_host: str = ""
    ) -> None:
        # Derived first: what cannot be honoured is refused before anything exists.
        self.spec: ContainerSpec = container_spec(plugin)
        self.container: PluginContainer | None = None
        super().__init__(out_dir=out_dir, worker=worker, plugin=plugin)
        # the run's engine (--docker-host), or a private one: never read from the environment
        self.engine = DockerEngine(
            self.ledger, what=f"hvconform worker {worker}", external=docker_host
        )
        self.report = TargetReport(out_dir, worker)
        self.images: ImageSet | None = None
        self.podman: PodmanRuntime | None = None
        self._records: list[dict[str, Any]] = []
        self._guest_rootfs = Path()
        self._guest_config: dict[str, Any] = {}
        self._runs = 0

    # -- lifecycle ------------------------------------------------------------------------

    def setup(self) -> None:
        _check_tools()
        try:
            host = self.engine.acquire()
        except EngineError as exc:
            raise EnvironmentBlocked(f"no Docker engine: {exc}") from exc
        client = self.engine.client(timeout=600)
        try:
            self.images = ensure_images(client)
            image = self._plugin_image(client, host)
            self._guest_rootfs = export_rootfs(client, self.images.guest)
            self._guest_config = image_config(client, self.images.guest)
            engine_version = client.version()
        finally:
            client.close()
        self.report.set("runtime", "container")
        self.report.set("images", {**self.images.to_json(), "plugin_under_test": image})
        self.report.set("plugin_spec", self.spec.to_json())
        self.report.set(
            "engine",
            {
                "host": host,
                "version": engine_version.get("Version", ""),
                "api_version": engine_version.get("ApiVersion", ""),
                "started_by_harness": self.engine.started_here,
                "workload_runtime": "podman (CDI), rootfs of the guest image",
            },
        )
        super().setup()
        self._record_plugin_evidence()
        self._negative_control()

    def _plugin_image(self, client: docker.DockerClient, host: str) -> dict[str, Any]:
        """The profile's image in the engine: this tree's build under the shipped profile's tag
        (the documented `docker build -t hv-device-plugin:<version>`), or one already there."""
        assert self.images is not None
        ref = self.spec.image
        if ref == default_plugin_image():
            repository, _, tag = ref.rpartition(":")
            client.images.get(self.images.plugin.tag).tag(repository, tag)
        try:
            found = client.images.get(ref)
        except docker.errors.ImageNotFound:
            raise EnvironmentBlocked(
                f"deploy.image {ref} is not in the Docker engine at {host} and is never pulled: "
                "build or load it there first (--docker-host selects an engine of yours)"
            ) from None
        built = ref == default_plugin_image()
        return {"ref": ref, "id": str(found.id), "built_from_this_tree": built}

    def _start_plugin(self, sockets: Path | None = None) -> None:
        """The profile's container with the node's dirs where the profile says the plugin looks
        (as LocalNode binds them for the sandbox); `sockets` replaces the kubelet's dir."""
        paths, ro = self.plugin.paths, self.spec.read_only_paths
        binds = [
            Bind(sockets or self.plugin_dir, paths.device_plugin_dir,
                 paths.device_plugin_dir in ro),
            Bind(self.dirs["cdi"], paths.cdi_dir, paths.cdi_dir in ro),
        ]  # fmt: skip
        if paths.host_dev_dir:
            binds.append(Bind(self.dirs["host_dev"], paths.host_dev_dir, paths.host_dev_dir in ro))
        self.container = PluginContainer(
            host=self.engine.host, spec=self.spec, binds=binds, devices=paths.devices,
            ledger=self.ledger, name=f"hvc-{self.worker}-{secrets.token_hex(3)}",
            log_path=self.root / "plugin.log", records=self._records,
        )  # fmt: skip
        try:
            self.container.start()
        finally:
            self.report.set("plugin_containers", self._records)

    def _stop_plugin(self) -> None:
        if self.container is not None:
            self.container.stop()
            self.report.set("plugin_containers", self._records)

    def teardown(self) -> None:
        left: list[str] = []
        try:
            if self.podman is not None:
                left = self.podman.close()  # stops the workloads before the node goes
            super().teardown()
        finally:
            try:
                self.engine.release()
            finally:
                self.report.set("cleanup_leftovers", left)
        if left:
            raise RuntimeError(f"workload runtime left behind: {'; '.join(left)}")

    def _record_plugin_evidence(self) -> None:
        container = self._container()
        probes = {}
        for kind, argv in self.spec.exec_probes.items():  # the objects' own, as a kubelet runs
            code, output = container.exec(argv)
            probes[kind] = {"argv": shlex.join(argv), "exit": code, "output": output.strip()[-400:]}
        self.report.set("exec_probes", probes)
        caps = self._records[-1]
        if caps["CapEff"] != 0 or caps["NoNewPrivs"] != 1:
            raise RuntimeError(f"plugin container not hardened: {caps}")

    # -- the plugin -------------------------------------------------------------------------

    def _container(self) -> PluginContainer:
        if self.container is None:
            raise PluginContainerError("plugin container not created")
        return self.container

    def _observer(self, probe: Probe) -> Observer:
        return _ContainerObserver(self, probe)

    def health_addr(self) -> str:
        """127.0.0.1:<the port the objects name>, in the container's network namespace."""
        port = self.spec.health_port
        return "" if port is None else f"127.0.0.1:{port}"

    def plugin_running(self) -> bool:
        return self.container is not None and self._container().running

    def _ready_or_dead(self) -> bool:
        if not self._container().running:
            raise RuntimeError(f"the plugin container exited at setup:\n{self.plugin_log_tail(20)}")
        return self.plugin_ready() if self.readiness.observable else self.allocatable() > 0

    def plugin_instance(self) -> str:
        return self._container().container_id[:12]

    def restart_plugin(self) -> None:
        self._container().restart()
        self.report.set("plugin_containers", self._records)

    def plugin_cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self._container().pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def plugin_log_tail(self, lines: int = 50) -> str:
        if self.container is None:
            return super().plugin_log_tail(lines)
        return self.container.log_tail(lines)

    def plugin_ran(self) -> PluginRan:
        """What runs, read back: the engine's inspection and the kernel's view of the pid."""
        container = self._container()
        attrs, pid = container.attrs(), container.pid
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        if not raw:  # a zombie has none: nothing that runs can be named
            raise RuntimeError(f"plugin pid {pid} in {container.name} has no command line")
        argv = tuple(a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0"))
        engine_argv = [str(attrs.get("Path", "")), *map(str, attrs.get("Args") or [])]
        try:
            exe = str(Path(f"/proc/{pid}/exe").readlink())
        except OSError:
            exe = ""
        return PluginRan(
            how="container", argv=argv, exe=exe, pid=pid,
            image=str(attrs["Config"].get("Image", container.image)),
            image_id=str(attrs["Image"]), where=container.name,
            notes=(f"engine Path+Args: {shlex.join(engine_argv)}",
                   f"objects: {self.spec.workload}"),
        )  # fmt: skip

    # -- faults in the plugin's own view ----------------------------------------------------

    def redirect_plugin_sockets(self, empty: bool) -> None:
        # An empty dir over the socket dir in the plugin's namespace only: the kubelet (and the
        # host) keep the real one, as when a pod's hostPath points at the wrong dir.
        target = self.plugin.paths.device_plugin_dir
        if empty:
            hole = self.state / "empty-sockets"
            hole.mkdir(exist_ok=True)
            self._faults.add("sockets")  # first: a half-made fault is still undone
            self._container().bind_mount(hole, target)
        else:
            self._container().umount(target, lazy=True)
            self._faults.discard("sockets")

    def restore_plugin_sockets(self) -> None:
        """Give the isolated plugin the kubelet's directory back, where it looks for it."""
        self._container().bind_mount(self.plugin_dir, self.plugin.paths.device_plugin_dir)
        # "isolated" stays a fault: the restore after the check starts a container normally.

    def remap_device_unusable(self, unusable: bool) -> None:
        kvm = os.stat(KVM).st_rdev
        if unusable:
            null = self.state / "null-at-kvm"
            if not null.exists():
                os.mknod(null, stat.S_IFCHR | 0o600, os.makedev(1, 3))
            self._faults.add("remap")
            self._container().bind_mount(null, KVM)
            self.replace_char_device("host_dev", "kvm", 1, 3)  # identity made to match
        else:
            self._container().umount(KVM)
            self.replace_char_device("host_dev", "kvm", os.major(kvm), os.minor(kvm))
            self._faults.discard("remap")

    def set_device_present(self, present: bool) -> None:
        """Without a host-device view, the plugin's own /dev/kvm goes and comes back (made with
        the real device's numbers and mode, through the container's root)."""
        if self.plugin.paths.host_dev_dir:
            super().set_device_present(present)
            return
        container = self._container()
        inside = Path(f"/proc/{container.pid}/root{KVM}")
        if present:
            if not os.path.lexists(inside):
                real = os.stat(KVM)
                os.mknod(inside, stat.S_IFCHR | 0o600, real.st_rdev)
                inside.chmod(stat.S_IMODE(real.st_mode))
            self._faults.discard("device")
        else:
            self._faults.add("device")
            if KVM in container.plugin_mounts():
                container.umount(KVM)
            inside.unlink(missing_ok=True)


@contextlib.contextmanager
def open_node(
    ctx: RunContext, *, worker: str, metadata: object | None = None
) -> Iterator[ContainerNode]:
    """The registry's entry: the plugin under test as its profile's objects describe it."""
    node = ContainerNode(
        out_dir=ctx.out,
        worker=worker,
        plugin=ctx.plugin,
        docker_host=ctx.options_of(LocalOptions).docker_host,
    )
    with set_up(node) as node:
        yield node


def plan_text(options: LocalOptions, plugin: PluginUnderTest) -> str:
    """--dry-run: what a run on this target would start, make and remove."""
    engine = options.docker_host or "a private dockerd with roots of its own, started for the run"
    return machine_plan(
        "--target local --runtime container",
        plugin,
        [
            "a node root per worker as the process runtime's (plugin dir, tmpfs CDI dir, tmpfs "
            "host-device view with a mknod kvm node)",
            f"the Docker engine: {engine}",
            f"the plugin: image {plugin.image or '(none)'}, as its profile's objects say "
            "(command, args, env, mounts), the node's directories bound at its paths",
            "the kubelet: the suite's emulator of the device plugin API",
            "workloads: the suite's guest image under podman, its device injected through CDI",
        ],
        [
            "the plugin container and every container, image and volume the run made removed; "
            "a private engine stopped, its roots and mounts removed; each verified (the ledger)"
        ],
    )
