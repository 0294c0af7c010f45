"""The `node` target: the scenario catalogue against a real kubelet, API server and containerd.

The stack (see `stack`) is reused when `nox -s node-up` already started it, else started here and
stopped at teardown. The plugin under test runs as its profile describes it (`sandboxed`): its
command as is, in its own mount and network namespaces, with the kubelet's real plugin dir, the
CDI dir containerd reads (and nothing else does) and the host-device view bound where the
profile says it looks; its health observed through the profile's probes. Observations:
capacity/allocatable from the Node's status, allocations from pod status plus the podresources
API plus the container's CRI config (the CDI names the kubelet handed to containerd), workload
output from the container itself (`crictl exec`). Faults: files and mounts on this host, the
plugin's own view inside its mount namespace, kubelet restart by process (SIGTERM or SIGKILL),
plugin restart. After each check the node is restored (`restore`). One node per machine: run
with `-n 1`.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from hvconform.contract import featuregates
from hvconform.contract.ledger import mounts_at
from hvconform.contract.node import (
    CAP_DEVICE_LATE,
    CAP_NODE_REBOOT,
    CAP_POD_DEVICE_HEALTH,
    CAP_PODS,
    CAP_STREAM_END,
    Allocation,
    Area,
    DeviceSpec,
    GuestOutcome,
)
from hvconform.contract.plugin import PluginUnderTest
from hvconform.contract.results import EnvironmentBlocked
from hvconform.contract.runtime_facts import RuntimeFacts, runtime_side
from hvconform.contract.wait import WaitExpired, wait_for
from hvconform.guest.cdi_resolve import resolve
from hvconform.targets.host.hostfiles import device_metadata, mount, umount
from hvconform.targets.local.liveness import kubelet_live
from hvconform.targets.local.node import BASE_CAPABILITIES
from hvconform.targets.realnode import (
    BIN,
    CDI_DIR,
    FEATURE_GATES,
    HOST_DEV,
    NODE_NAME,
    RUN,
    procs,
    stack,
)
from hvconform.targets.realnode.configs import NAMESPACE, PKI, workload_pod
from hvconform.targets.realnode.events import NodeEventLog, klog_monotonic
from hvconform.targets.realnode.kubeapi import Api, PodResources
from hvconform.targets.realnode.pods import POD_TIMEOUT_S, RealPods
from hvconform.targets.realnode.reboot import RealNodeFaults, kubelet_sock_made
from hvconform.targets.realnode.restore import RealRestore
from hvconform.targets.realnode.sandboxed import (
    PLUGIN_LOG,
    SandboxedPlugin,
    make_shared,
    observed_capabilities,
)

SETUP_TIMEOUT_S = 90.0
# Pods, reboots, a late device, a stream the kubelet ends: made against the real kubelet (the
# ResourceHealthStatus gate is beta and on by default in v1.37.2, kube_features.go, and neither
# the kubelet nor the API server here sets a gate: allocatedResourcesStatus is filled and kept).
WORKLOAD_CAPABILITIES = frozenset(
    {CAP_PODS, CAP_NODE_REBOOT, CAP_DEVICE_LATE, CAP_STREAM_END, CAP_POD_DEVICE_HEALTH}
)
_REGISTERED = "Got registration request from device plugin"
_RESOURCE = re.compile(r'Got registration request from device plugin[^"]*" resourceName="([^"]+)"')


class RealNode(RealRestore, SandboxedPlugin, RealPods, RealNodeFaults):
    name = "node"

    def __init__(
        self, *, out_dir: Path, worker: str, plugin: PluginUnderTest, node_runtime: str = ""
    ) -> None:
        super().__init__(CDI_DIR, HOST_DEV)
        self.node_runtime = node_runtime  # which containerd the stack runs (realnode.runtimes)
        self._init_host_node(out_dir, worker, "")
        self.state = RUN / f"harness-{worker}"  # the harness's own: holes, staging, read storms
        self.workloads = RUN / "workloads"  # the workload pods' /state
        self._init_plugin(plugin)
        self.resource = plugin.resource or ""
        self.spec_name = plugin.cdi_spec or ""
        self.capabilities = (
            BASE_CAPABILITIES | observed_capabilities(plugin) | WORKLOAD_CAPABILITIES
        )
        self.api: Api | None = None
        self.podresources = PodResources()
        self.events_log: NodeEventLog | None = None
        self._pod_uids: dict[str, str] = {}
        self._workload_device = "/dev/kvm"  # until the first allocation says where it is
        self._own_stack = False
        self._pods: dict[int, str] = {}
        self._guests: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        self._ro_mounts: list[Path] = []

    # -- lifecycle ------------------------------------------------------------------------

    def setup(self) -> None:
        if not (BIN / "kube-apiserver").exists():
            raise EnvironmentBlocked(
                "the node target needs kube-apiserver: run `nox -s node-build`"
            )
        self.host_metadata_at_start = device_metadata("/dev/kvm")
        running = procs.recorded("kubelet")
        if running is None or not running.alive:
            if refused := stack.roots_refused():  # a kubelet root of someone else's: left alone
                raise EnvironmentBlocked(f"the node target's own kubelet: {refused}")
            self._own_stack = True
            for root in stack.ROOTS:
                if not root.exists():  # only what this run makes is its to remove
                    self.ledger.record("dir", str(root), f"real node {NODE_NAME} (this run's)")
            stack.up(runtime=self.node_runtime)
        self.api = Api(PKI)
        self._record_feature_gates()
        if (p := procs.recorded("plugin")) is not None and p.alive:
            raise EnvironmentBlocked(
                "a plugin already runs on the node (node-up --plugin): stop it"
            )
        self.events_log = NodeEventLog(self.api, lambda: self.resource, procs.LOGS / "kubelet.log")
        self.events_log.start()
        self.workloads.mkdir(parents=True, exist_ok=True)
        self.workloads.chmod(0o777)
        self.state.mkdir(parents=True, exist_ok=True)
        self.ledger.record("dir", str(self.state), "the harness's own dir on the real node")
        for shared in (CDI_DIR, HOST_DEV):
            make_shared(shared)  # host-side faults reach the plugin's copy, as a hostPath
        for name, data in self.sentinels.items():
            self.write_file("cdi", name, data)
        PLUGIN_LOG.unlink(missing_ok=True)  # this run's plugin log only
        self._before_plugin()
        self._start_plugin()
        self.resource = self.resource or wait_for(
            self._registered_resource,
            SETUP_TIMEOUT_S,
            "the plugin's Register call at node setup",
            interval=0.1,
        )
        wait_for(self._ready_or_dead, SETUP_TIMEOUT_S, "plugin ready at node setup", interval=0.05)
        wait_for(lambda: self.allocatable() > 0, SETUP_TIMEOUT_S, "allocatable > 0 at node setup")
        runtime = self.container_runtime()
        try:
            allocation = wait_for(
                self._admitted, SETUP_TIMEOUT_S, "an Allocate at node setup", interval=0.5
            )
        except WaitExpired as exc:  # the runtime's CDI off or blind: its failure, not the plugin's
            seen = f"the first workload pod never ran ({exc})"
            if blamed := runtime_side(runtime, str(CDI_DIR), seen):
                raise EnvironmentBlocked(blamed) from exc
            raise
        if allocation.cdi_devices and (
            dropped := runtime_side(
                runtime, str(CDI_DIR), f"the allocation names {allocation.cdi_devices[0]}"
            )
        ):
            raise EnvironmentBlocked(dropped)
        self._workload_device = self._device_in_workload(allocation) or self._workload_device
        self._take_baseline(allocation, 30)

    def _record_feature_gates(self) -> None:
        """What the run's environment names: the gates this target sets, and the API server's
        own word on the gates that decide what DRA and device health can do here. Not the
        kubelet's through the node proxy, as on a cluster: this Node has no address to proxy to
        (the kubelet refuses its loopback --node-ip as one: "known addresses: []")."""
        api = self.api
        assert api is not None
        api_server = featuregates.read(lambda: str(api.get("/metrics")))
        featuregates.record(self.out_dir, FEATURE_GATES, api_server)

    def _before_plugin(self) -> None:
        """What the node gives the plugin before it first starts (a DRA node: dra_node)."""
        self._alias_plugin_dir()

    def _after_plugin(self) -> None:
        self._unalias_plugin_dir()

    def _registered_resource(self) -> str | None:
        """The resource of the plugin's Register call, from the kubelet's log since its start."""
        if not self.plugin_running():
            raise RuntimeError(f"the plugin exited during node setup:\n{self.plugin_log_tail(20)}")
        try:
            with (procs.LOGS / "kubelet.log").open("rb") as log:
                log.seek(self._kubelet_log_at)
                found = _RESOURCE.findall(log.read().decode(errors="replace"))
        except OSError:
            return None
        return str(found[-1]) if found else None

    def _ready_or_dead(self) -> bool:
        if not self.plugin_running():
            raise RuntimeError(f"the plugin exited during node setup:\n{self.plugin_log_tail(20)}")
        # Without an observable readiness, the kubelet's view is the readiness.
        return self.plugin_ready() if self.readiness.observable else self.allocatable() > 0

    def container_runtime(self) -> RuntimeFacts:
        """The node's runtime as its daemon says it runs (the suite records it per node). Asked
        once per node: the setup's CDI check and the run's record share the answer."""
        facts: RuntimeFacts | None = self.__dict__.get("_runtime_facts")
        if facts is None:
            facts = self.__dict__["_runtime_facts"] = stack.runtime_facts()
        return facts

    def plugin_live(self) -> bool:
        """As the kubelet judges it (local/liveness.py): the process runs and its liveness
        probe, if the profile names one, did not fail three times in a row; never readiness."""
        probe = self.liveness if self.liveness.observable else None
        return kubelet_live(self.plugin_running, probe)

    def _admitted(self) -> Allocation | None:
        allocation = self.allocate()
        if allocation.ok:
            return allocation
        self.release(allocation)
        return None

    def teardown(self) -> None:
        try:
            for proc, _ in self._guests.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
            self._guests.clear()
            for pod in list(self._pods.values()):
                self._delete_pod(pod)
            self._pods.clear()
            if self.api is not None:
                self.delete_check_pods()
            for mp in reversed(self._ro_mounts):
                umount(mp)
            self._ro_mounts.clear()
            self._stop_plugin()
            self._after_plugin()
        finally:
            if self.events_log is not None:
                self.events_log.stop()
            if PLUGIN_LOG.exists():
                (self.out_dir / f"plugin-{self.worker}.log").write_bytes(PLUGIN_LOG.read_bytes())
            if self._own_stack:
                left = stack.down()
                if left:
                    raise RuntimeError(f"node-down left: {left}")
            else:
                for name in self.sentinels:
                    self.remove("cdi", name)
                # never through a mount: the alias there is the kubelet's own plugin dir
                if not stack.mounts_under((self.state,)):
                    shutil.rmtree(self.state, ignore_errors=True)

    # -- storage --------------------------------------------------------------------------

    def set_storage_read_only(self, area: Area, read_only: bool) -> None:
        target, staging = self.dirs[area], self.state / f"ro-{area}"
        if read_only:
            staging.mkdir(exist_ok=True)
            self._faults.add(f"read-only {area}")  # first: a half-made fault is still undone
            # the CDI dir is the stack's own tmpfs: the entry is gone when that one is back on top
            below = {mp: mounts_at(str(mp)) for mp in (staging, target)}
            mount(["-t", "tmpfs", "-o", "size=1m,mode=0755", "hv-ro", str(staging)])
            self._ro_mounts.append(staging)
            self.ledger.record(
                "mount", str(staging), f"read-only storage fault below={below[staging]}"
            )
            subprocess.run(["mount", "-o", "remount,ro", str(staging)], check=True)
            mount(["--bind", str(staging), str(target)])  # reaches the plugin's shared copy
            self._ro_mounts.append(target)
            self.ledger.record(
                "mount", str(target), f"read-only storage fault below={below[target]}"
            )
        else:
            for mp in (target, staging):
                if mp in self._ro_mounts:  # a half-made fault is undone as far as it got
                    umount(mp)
                    self._ro_mounts.remove(mp)
            self._faults.discard(f"read-only {area}")
        self.touched()

    # -- the kubelet ------------------------------------------------------------------------

    def restart_kubelet(self, graceful: bool) -> float:
        """Back = when the new kubelet.sock was made (a plugin may register before healthz)."""
        kubelet = procs.recorded("kubelet")
        assert kubelet is not None
        stopped_wall = time.time()
        self.touched()
        kubelet.stop(sig=signal.SIGTERM if graceful else signal.SIGKILL)
        stack.start_kubelet(self.api)
        return kubelet_sock_made(stopped_wall)

    def last_registration_at(self) -> float | None:
        """When the kubelet last logged a registration request of the plugin's resource, on the
        monotonic clock."""
        last = None
        ours = f'resourceName="{self.resource}"'
        for line in procs.log_tail("kubelet", 5000).splitlines():
            if _REGISTERED in line and ours in line:
                last = klog_monotonic(line) or last
        return last

    # -- workloads ------------------------------------------------------------------------

    def allocate(self) -> Allocation:
        assert self.api is not None
        name = f"hv-alloc-{uuid.uuid4().hex[:8]}"
        body = self._placed(workload_pod(name, self.resource, ["/pause"], self.workloads))
        self.api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body)

        pod, reason, message = wait_for(
            lambda: self._allocation_settled(name), POD_TIMEOUT_S,
            f"pod {name} running or refused", 0.1,
        )  # fmt: skip
        status = pod["status"]
        allocation = Allocation(
            ok=status["phase"] == "Running",
            phase=status["phase"] if status["phase"] == "Failed" else "",
            reason=reason,
            message=message,
        )
        if allocation.ok:
            for entry in self.podresources.pods():
                if entry.name == name:
                    allocation.device_ids = entry.devices.get(self.resource, [])
            info = json.loads(stack._crictl("inspect", self._container_id(name)).stdout)
            config = info.get("info", {}).get("config", {})
            allocation.cdi_devices = [d["name"] for d in config.get("CDI_devices", [])]
            allocation.device_specs = [
                DeviceSpec(d["container_path"], d["host_path"], d.get("permissions", ""))
                for d in config.get("devices", [])
            ]
        self._pods[id(allocation)] = name
        return allocation

    def _allocation_settled(self, name: str) -> tuple[dict[str, Any], str, str] | None:
        """The allocation's pod once admitted or refused, with the refusal's reason."""
        pod = self._settled(name)
        if pod is None:
            return None
        return pod, pod["status"].get("reason", ""), pod["status"].get("message", "")

    def release(self, allocation: Allocation) -> None:
        name = self._pods.pop(id(allocation), None)
        if name is not None:
            self._delete_pod(name)

    def _device_in_workload(self, allocation: Allocation) -> str:
        """Where the runtime put the hypervisor node: as the CDI spec says, else the DeviceSpec
        (what any plugin's workload learns from its own image, never a variable one sets)."""
        if allocation.cdi_devices:
            return resolve(allocation.cdi_devices[0], [str(CDI_DIR)]).node_paths[0]
        return allocation.device_specs[0].container_path if allocation.device_specs else ""

    def _exec(self, allocation: Allocation, argv: list[str]) -> list[str]:
        cid = self._container_id(self._pods[id(allocation)])
        return [*stack.crictl_argv(), "exec", cid, *argv]

    def run_guest(self, allocation: Allocation) -> GuestOutcome:
        device = self._device_in_workload(allocation)
        argv = ["/usr/bin/python3", "-m", "hvconform.guest", "run", "--json", "--device", device]
        cmd = self._exec(allocation, argv)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("{")]
        value = json.loads(lines[-1]).get("value") if lines else None
        detail = (proc.stdout + proc.stderr).strip()[-600:]
        return GuestOutcome(ok=proc.returncode == 0, detail=detail, value=value)

    def start_long_guest(self, allocation: Allocation) -> str:
        handle = f"guest-{len(self._guests)}"
        device = self._device_in_workload(allocation)
        argv = ["/usr/bin/python3", "-m", "hvconform.guest", "counter", "--device", device,
                "--state-file", f"/state/{handle}.json", "--interval", "0.05"]  # fmt: skip
        proc = subprocess.Popen(self._exec(allocation, argv), stdout=subprocess.DEVNULL)
        self.ledger.record_process(proc.pid, f"crictl exec of {handle}")
        self._guests[handle] = (proc, self._pods[id(allocation)])
        return handle

    def long_guest_counter(self, handle: str) -> int:
        proc, _ = self._guests[handle]
        assert proc.poll() is None, f"long-running guest {handle} exited {proc.returncode}"
        try:
            return int(json.loads((self.workloads / f"{handle}.json").read_text())["counter"])
        except (OSError, ValueError, KeyError):
            return 0
