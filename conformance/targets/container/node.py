"""The local node target with real container runtimes (`--runtime container`).

The node is LocalNode's (node root, tmpfs CDI dir and host-device view, kubelet emulator, the
same faults); what changes is who runs the plugin and the workloads:
- the plugin is the image built from this tree (container.images), run by the Docker engine as
  a hardened container (targets.plugin_container: no capabilities, no-new-privileges,
  read-only root, no network, /dev/kvm passed explicitly, node dirs bind-mounted rslave);
  faults inside its mount namespace go through `nsenter -t <pid> -m` as with the sandbox;
- workloads run under podman from the guest image's filesystem and get the device ONLY through
  CDI (`--device hyperlight.dev/hypervisor=kvm`) resolved from the spec the plugin wrote, as
  uid/gid 65534 (targets.podman). A negative control at setup (no CDI device) must fail.
results.json gets, per worker (targets.target_report): the image IDs, each plugin container's
inspection with CapEff from /proc/<pid>/status, the exec probe, and every guest run with the
CDI name that injected its device.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conformance.contract.base import set_up
from conformance.contract.node import Allocation, GuestOutcome
from conformance.contract.runcontext import RunContext
from conformance.contract.plugin import resolve as resolve_plugin
from conformance.contract.results import EnvironmentBlocked
from conformance.contract.target_report import TargetReport
from conformance.targets.container.engine import DockerEngine, EngineError
from conformance.targets.container.images import (
    ImageSet,
    ensure_images,
    export_rootfs,
    image_config,
)
from conformance.targets.container.plugin_container import PluginContainer, PluginContainerError
from conformance.targets.container.podman import PodmanRuntime
from conformance.targets.local.node import HEALTH_PORT, LocalNode

TOOLS = ("dockerd", "containerd", "podman", "crun", "unshare", "nsenter", "debootstrap")
GUEST_TIMEOUT_S = 60.0


def _check_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise EnvironmentBlocked(
            f"--runtime container needs {', '.join(missing)}: scripts/bootstrap installs them"
        )


def _guest_json(stdout: str) -> dict[str, Any]:
    lines = [ln for ln in stdout.splitlines() if ln.strip().startswith("{")]
    if not lines:
        return {}
    data: dict[str, Any] = json.loads(lines[-1])
    return data


class ContainerNode(LocalNode):
    """LocalNode with the plugin under Docker and the workloads under podman."""

    runtime = "container"

    def __init__(self, *, out_dir: Path, worker: str, plugin_cmd: str) -> None:
        super().__init__(
            out_dir=out_dir,
            worker=worker,
            plugin=resolve_plugin(plugin_cmd=plugin_cmd or "", plugin_profile=""),
        )
        # --plugin-cmd replaces the image's entrypoint; the standard flags follow it.
        self.entrypoint = shlex.split(plugin_cmd) if plugin_cmd else []
        self.engine = DockerEngine(self.ledger, what=f"hvconform worker {worker}")
        self.report = TargetReport(out_dir, worker)
        self.images: ImageSet | None = None
        self.container: PluginContainer | None = None
        self.podman: PodmanRuntime | None = None
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
            self._guest_rootfs = export_rootfs(client, self.images.guest)
            self._guest_config = image_config(client, self.images.guest)
            engine_version = client.version()
        finally:
            client.close()
        self.report.set("runtime", "container")
        self.report.set("images", self.images.to_json())
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

    def _start_plugin(self, sockets: Path | None = None) -> None:
        assert self.images is not None
        args = [
            "--device-plugin-dir", str(self.plugin_dir), "--cdi-dir", str(self.dirs["cdi"]),
            "--host-dev-dir", str(self.dirs["host_dev"]), "--health-addr", f"127.0.0.1:{HEALTH_PORT}",
        ]  # fmt: skip
        self.container = PluginContainer(
            host=self.engine.host,
            image=self.images.plugin.tag,
            argv=args,
            binds=[self.plugin_dir, self.dirs["cdi"], self.dirs["host_dev"]],
            ledger=self.ledger,
            name=f"hvc-{self.worker}-{secrets.token_hex(3)}",
            log_path=self.root / "plugin.log",
            health_port=HEALTH_PORT,
            entrypoint=self.entrypoint,
        )
        self.container.start()

    def _stop_plugin(self) -> None:
        if self.container is not None:
            self.container.stop()
            self.report.set("plugin_containers", self.container.records)

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
        for kind in ("liveness", "readiness"):
            args = ("--device-plugin-dir", str(self.plugin_dir))
            code, output = container.exec_probe(kind, *args)
            probes[kind] = {"argv": shlex.join(["hv-device-plugin", "probe", kind, *args]),
                            "exit": code, "output": output.strip()[-400:]}  # fmt: skip
        self.report.set("exec_probes", probes)
        self.report.set("plugin_containers", container.records)
        caps = container.records[-1]
        if caps["CapEff"] != 0 or caps["NoNewPrivs"] != 1:
            raise RuntimeError(f"plugin container not hardened: {caps}")

    def _negative_control(self) -> None:
        """A workload WITHOUT the CDI device must not open /dev/kvm; else nothing is shown."""
        podman = self._podman()
        name = podman.new_name()
        proc = podman.run(
            name, ["run", "--json"], env={"HYPERLIGHT_DEVICE_PATH": "/dev/kvm"}, timeout=60
        )
        record = _guest_json(proc.stdout)
        entry = {"container": name, "cdi_devices": [], "exit": proc.returncode,
                 "ok": bool(record.get("ok")), "reason": str(record.get("reason", ""))[:300]}  # fmt: skip
        self.report.set("negative_control", entry)
        if proc.returncode == 0 or record.get("ok"):
            raise RuntimeError(f"negative control: a workload without CDI opened /dev/kvm: {entry}")

    # -- the plugin -------------------------------------------------------------------------

    def _container(self) -> PluginContainer:
        if self.container is None:
            raise PluginContainerError("plugin container not created")
        return self.container

    def _http_ok(self, path: str) -> bool:
        try:
            status, _ = self._container().http_get(path, timeout=2)
        except (OSError, PluginContainerError):
            return False
        return status == 200

    def plugin_live(self) -> bool:
        return self._http_ok("/healthz")

    def plugin_ready(self) -> bool:
        return self._http_ok("/readyz")

    def plugin_running(self) -> bool:
        return self.container is not None and self._container().running

    def _ready_or_dead(self) -> bool:
        if not self._container().running:
            raise RuntimeError(f"the plugin container exited at setup:\n{self.plugin_log_tail(20)}")
        return self.plugin_ready()

    def plugin_instance(self) -> str:
        return self._container().container_id[:12]

    def restart_plugin(self) -> None:
        self._container().restart()
        self.report.set("plugin_containers", self._container().records)

    def plugin_cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self._container().pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def plugin_log_tail(self, lines: int = 50) -> str:
        if self.container is None:
            return super().plugin_log_tail(lines)
        return self.container.log_tail(lines)

    def redirect_plugin_sockets(self, empty: bool) -> None:
        # An empty tmpfs over the socket dir in the plugin's namespace only: the kubelet (and
        # the host) keep the real one, as when a pod's hostPath points at the wrong dir.
        if empty:
            args = ["-t", "tmpfs", "-o", "size=64k,mode=0755", "hv-empty-sockets"]
            self._container().mount(args, self.plugin_dir)
        else:
            self._container().umount(self.plugin_dir, lazy=True)

    def remap_device_unusable(self, unusable: bool) -> None:
        kvm = os.stat("/dev/kvm").st_rdev
        if unusable:
            # The container's own /dev/null at /dev/kvm: a per-container mapping, as on AKS.
            self._container().mount(["--bind", "/dev/null"], Path("/dev/kvm"))
            self.replace_char_device("host_dev", "kvm", 1, 3)  # identity made to match
        else:
            self._container().umount(Path("/dev/kvm"))
            self.replace_char_device("host_dev", "kvm", os.major(kvm), os.minor(kvm))

    # -- workloads ------------------------------------------------------------------------

    def _podman(self) -> PodmanRuntime:
        if self.podman is None:
            self.podman = PodmanRuntime(
                cdi_dir=self.dirs["cdi"], rootfs=self._guest_rootfs,
                image_config=self._guest_config, work_dir=self.state, ledger=self.ledger,
                label=self.worker,
            )  # fmt: skip
        return self.podman

    def run_guest(self, allocation: Allocation) -> GuestOutcome:
        podman = self._podman()
        name = podman.new_name()
        # Different inputs every run: equal outputs could not come from a cached answer.
        self._runs += 1
        argv = ["run", "--json", "--a", str(7 + self._runs), "--b", str(3 * self._runs)]
        proc = podman.run(
            name, argv, cdi_devices=allocation.cdi_devices, env=allocation.envs,
            timeout=GUEST_TIMEOUT_S,
        )  # fmt: skip
        record = _guest_json(proc.stdout)
        ok = proc.returncode == 0 and bool(record.get("ok"))
        cdi = ",".join(allocation.cdi_devices)
        entry = {
            "container": name, "cdi_devices": allocation.cdi_devices, "exit": proc.returncode,
            "device": record.get("device"), "uid": record.get("uid"), "gid": record.get("gid"),
            "value": record.get("value"), "expected": record.get("expected"), "ok": ok,
        }  # fmt: skip
        note = f"guest {name}: device {record.get('device')} injected by CDI {cdi}, "
        note += f"uid {record.get('uid')}, value {record.get('value')}, {'ok' if ok else 'FAILED'}"
        self.report.append("guest_runs", entry, note)
        detail = (proc.stdout + proc.stderr).strip()[-600:]
        return GuestOutcome(ok=ok, detail=detail, value=record.get("value"))

    def start_long_guest(self, allocation: Allocation) -> str:
        handle = f"guest-{len(self._guests)}"
        state = self.guest_dir / f"{handle}.json"
        argv = [
            "counter", "--device", self._device_in_workload(allocation),
            "--state-file", str(state), "--interval", "0.05",
        ]  # fmt: skip
        podman = self._podman()
        name = podman.new_name()
        log = (self.state / f"{handle}.log").open("ab")
        try:
            proc = podman.start(
                name, argv, cdi_devices=allocation.cdi_devices, env=allocation.envs,
                volumes=[self.guest_dir], stdout=log,
            )  # fmt: skip
        finally:
            log.close()
        self._guests[handle] = proc
        entry = {"container": name, "cdi_devices": allocation.cdi_devices, "long_running": True}
        self.report.append(
            "guest_runs", entry, f"long guest {name} via CDI {allocation.cdi_devices}"
        )
        return handle


@contextlib.contextmanager
def open_node(
    ctx: RunContext, *, worker: str, metadata: object | None = None
) -> Iterator[ContainerNode]:
    """The registry's entry: the plugin under test as its profile describes it."""
    with set_up(ContainerNode(out_dir=ctx.out, worker=worker, plugin=ctx.plugin)) as node:
        yield node
