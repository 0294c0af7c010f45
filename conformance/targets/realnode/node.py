"""The `node` target: the scenario catalogue against a real kubelet, API server and containerd.

The stack (see `stack`) is reused when `nox -s node-up` already started it, else started here and
stopped at teardown. The plugin under test runs as a host process on the kubelet's real plugin
dir, writing CDI specs to the dir containerd reads (and nothing else does). Observations:
capacity/allocatable from the Node's status, allocations from pod status plus the podresources
API plus the container's CRI config (the CDI names the kubelet handed to containerd), workload
output from the container itself (`crictl exec`). Faults: files on this host, kubelet restart by
process (SIGTERM or SIGKILL), plugin restart. One node per machine: run with `-n 1`.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from conformance.contract.base import set_up
from conformance.contract.ledger import mounts_at
from conformance.contract.node import (
    CAP_DEVICE_VIEW,
    CAP_GUEST,
    CAP_KUBELET_CRASH,
    CAP_KUBELET_RESTART,
    CAP_LONG_GUEST,
    CAP_PLUGIN_RESTART,
    CAP_READ_ONLY,
    CAP_READ_STORM,
    Allocation,
    Area,
    GuestOutcome,
)
from conformance.contract.runcontext import RunContext
from conformance.contract.results import EnvironmentBlocked
from conformance.contract.wait import wait_for
from conformance.targets.local.hostfiles import device_metadata, mount, umount
from conformance.targets.realnode import (
    BIN,
    CDI_DIR,
    HOST_DEV,
    NODE_NAME,
    PLUGIN_DIR,
    RUN,
    procs,
    stack,
)
from conformance.targets.realnode.configs import NAMESPACE, PKI, workload_pod
from conformance.targets.realnode.freshness import FreshStatus
from conformance.targets.realnode.kubeapi import Api, ApiError, PodResources
from plugin.api.names import HYPERVISOR_RESOURCE, SPEC_FILENAME
from plugin.api.wire import KUBELET_SOCKET

RESOURCE = HYPERVISOR_RESOURCE
SPEC_NAME = SPEC_FILENAME
SETUP_TIMEOUT_S = 90.0
POD_TIMEOUT_S = 60.0
_REGISTERED = re.compile(
    r"^I(\d{4} \d{2}:\d{2}:\d{2}\.\d+).*Got registration request from device plugin"
)


class RealNode(FreshStatus):
    name = "node"
    resource = RESOURCE
    spec_name = SPEC_NAME
    capabilities = frozenset(
        {
            CAP_KUBELET_RESTART,
            CAP_KUBELET_CRASH,
            CAP_PLUGIN_RESTART,
            CAP_READ_ONLY,
            CAP_DEVICE_VIEW,
            CAP_GUEST,
            CAP_LONG_GUEST,
            CAP_READ_STORM,
        }
    )

    def __init__(self, *, out_dir: Path, worker: str, plugin_cmd: str) -> None:
        super().__init__(CDI_DIR, HOST_DEV)
        self._init_host_node(out_dir, worker, plugin_cmd)
        self.api: Api | None = None
        self.podresources = PodResources()
        self._own_stack = False
        self._pods: dict[int, str] = {}
        self._guests: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        self._ro_mounts: list[Path] = []
        self.state = RUN / "workloads"

    # -- lifecycle ------------------------------------------------------------------------

    def setup(self) -> None:
        if not (BIN / "kube-apiserver").exists():
            raise EnvironmentBlocked(
                "the node target needs kube-apiserver: run `nox -s node-build`"
            )
        self.host_metadata_at_start = device_metadata("/dev/kvm")
        running = procs.recorded("kubelet")
        if running is None or not running.alive:
            self._own_stack = True
            for root in stack.ROOTS:
                self.ledger.record("dir", str(root), f"real node {NODE_NAME} (stack of this run)")
            stack.up()
        self.api = Api(PKI)
        if (p := procs.recorded("plugin")) is not None and p.alive:
            raise EnvironmentBlocked(
                "a plugin already runs on the node (node-up --plugin): stop it"
            )
        self.state.mkdir(parents=True, exist_ok=True)
        self.state.chmod(0o777)
        for name, data in self.sentinels.items():
            self.write_file("cdi", name, data)
        (procs.LOGS / "plugin.log").unlink(missing_ok=True)  # this run's plugin log only
        self._start_plugin()
        wait_for(self.plugin_ready, SETUP_TIMEOUT_S, "plugin ready at node setup")
        wait_for(lambda: self.allocatable() > 0, SETUP_TIMEOUT_S, "allocatable > 0 at node setup")
        self.baseline_spec = wait_for(lambda: self.read_file("cdi", SPEC_NAME), 30, "the CDI spec")
        allocation = self.allocate()
        if allocation.ok:
            self.session_guest = self.start_long_guest(allocation)

    def teardown(self) -> None:
        for proc, _ in self._guests.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self._guests.clear()
        for pod in list(self._pods.values()):
            self._delete_pod(pod)
        self._pods.clear()
        for mp in reversed(self._ro_mounts):
            umount(mp)
        if (p := procs.recorded("plugin")) is not None:
            p.stop()
            procs.forget("plugin")
        log = procs.LOGS / "plugin.log"
        if log.exists():
            (self.out_dir / f"plugin-{self.worker}.log").write_bytes(log.read_bytes())
        if self._own_stack:
            left = stack.down()
            if left:
                raise RuntimeError(f"node-down left: {left}")
        else:
            for name in self.sentinels:
                self.remove("cdi", name)

    # -- storage --------------------------------------------------------------------------

    def set_storage_read_only(self, area: Area, read_only: bool) -> None:
        target, staging = self.dirs[area], RUN / f"ro-{area}"
        if read_only:
            staging.mkdir(exist_ok=True)
            # the CDI dir is the stack's own tmpfs: the entry is gone when that one is back on top
            below = {mp: mounts_at(str(mp)) for mp in (staging, target)}
            mount(["-t", "tmpfs", "-o", "size=1m,mode=0755", "hv-ro", str(staging)])
            subprocess.run(["mount", "-o", "remount,ro", str(staging)], check=True)
            mount(["--bind", str(staging), str(target)])
            self._ro_mounts += [staging, target]
            for mp in (staging, target):
                self.ledger.record("mount", str(mp), f"read-only storage fault below={below[mp]}")
        else:
            for mp in (target, staging):
                umount(mp)
                self._ro_mounts.remove(mp)
        self.touched()

    # -- the plugin -------------------------------------------------------------------------

    def _start_plugin(self) -> None:
        proc = stack.start_plugin(self.plugin_cmd)
        self.ledger.record_process(proc.pid, "plugin under test (host process)")

    def _plugin(self) -> procs.Proc:
        p = procs.recorded("plugin")
        assert p is not None, "the plugin was never started"
        return p

    def _http_ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{stack.PLUGIN_HEALTH}{path}", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def plugin_live(self) -> bool:
        return self._http_ok("/healthz")

    def plugin_ready(self) -> bool:
        return self._http_ok("/readyz")

    def plugin_instance(self) -> str:
        return str(self._plugin().pid)

    def restart_plugin(self) -> None:
        self._plugin().stop()
        self.touched()  # after the stop: the kubelet sees the old stream close at once
        self._start_plugin()

    def redirect_plugin_sockets(self, empty: bool) -> None:
        raise NotImplementedError("socket-redirect needs the plugin's own mount namespace")

    def remap_device_unusable(self, unusable: bool) -> None:
        raise NotImplementedError("device-remap needs the plugin's own mount namespace")

    def plugin_log_tail(self, lines: int = 50) -> str:
        return procs.log_tail("plugin", lines)

    def plugin_cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self._plugin().pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / 100.0

    # -- the kubelet ------------------------------------------------------------------------

    def restart_kubelet(self, graceful: bool) -> float:
        """Back = when the new kubelet.sock was made (a plugin may register before healthz)."""
        kubelet = procs.recorded("kubelet")
        assert kubelet is not None
        stopped_wall = time.time()
        self.touched()
        kubelet.stop(sig=signal.SIGTERM if graceful else signal.SIGKILL)
        stack.start_kubelet(self.api)
        sock = PLUGIN_DIR / KUBELET_SOCKET

        def made() -> float | None:
            with contextlib.suppress(FileNotFoundError):
                if (mtime := sock.stat().st_mtime) >= stopped_wall:
                    return mtime
            return None

        made_wall = wait_for(made, 30, "the new kubelet.sock")
        return made_wall - (time.time() - time.monotonic())

    def last_registration_at(self) -> float | None:
        """When the kubelet last logged a registration request, on the monotonic clock."""
        last = None
        for line in procs.log_tail("kubelet", 5000).splitlines():
            if m := _REGISTERED.match(line):
                last = m.group(1)
        if last is None:
            return None
        year = datetime.now(UTC).year
        wall = datetime.strptime(f"{year}{last}", "%Y%m%d %H:%M:%S.%f").replace(tzinfo=UTC)
        return wall.timestamp() - (time.time() - time.monotonic())

    # -- workloads ------------------------------------------------------------------------

    def _pod(self, name: str) -> dict[str, Any] | None:
        assert self.api is not None
        try:
            pod: dict[str, Any] = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return pod

    def _delete_pod(self, name: str) -> None:
        assert self.api is not None
        try:
            self.api.request(
                "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}?gracePeriodSeconds=0"
            )
        except ApiError as exc:
            if exc.status != 404:
                raise
        wait_for(lambda: self._pod(name) is None, POD_TIMEOUT_S, f"pod {name} deleted")

    def _container_id(self, pod: str) -> str:
        out = stack._crictl("ps", "-q", "--label", f"io.kubernetes.pod.name={pod}").stdout.split()
        return out[0] if out else ""

    def allocate(self) -> Allocation:
        assert self.api is not None
        name = f"hv-alloc-{uuid.uuid4().hex[:8]}"
        body = workload_pod(name, RESOURCE, ["/pause"], self.state)
        self.api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body)

        def settled() -> dict[str, Any] | None:
            pod = self._pod(name)
            phase = (pod or {}).get("status", {}).get("phase")
            return pod if phase in ("Running", "Failed", "Succeeded") else None

        pod = wait_for(settled, POD_TIMEOUT_S, f"pod {name} running or failed", interval=0.1)
        status = pod["status"]
        allocation = Allocation(
            ok=status["phase"] == "Running",
            phase=status["phase"] if status["phase"] == "Failed" else "",
            reason=status.get("reason", ""),
            message=status.get("message", ""),
        )
        if allocation.ok:
            for entry in self.podresources.pods():
                if entry.name == name:
                    allocation.device_ids = entry.devices.get(RESOURCE, [])
            info = json.loads(stack._crictl("inspect", self._container_id(name)).stdout)
            config = info.get("info", {}).get("config", {})
            allocation.cdi_devices = [d["name"] for d in config.get("CDI_devices", [])]
        self._pods[id(allocation)] = name
        return allocation

    def release(self, allocation: Allocation) -> None:
        name = self._pods.pop(id(allocation), None)
        if name is not None:
            self._delete_pod(name)

    def _exec(self, allocation: Allocation, argv: list[str]) -> list[str]:
        cid = self._container_id(self._pods[id(allocation)])
        return [*stack.crictl_argv(), "exec", cid, *argv]

    def run_guest(self, allocation: Allocation) -> GuestOutcome:
        cmd = self._exec(
            allocation, ["/usr/bin/python3", "-m", "conformance.guest", "run", "--json"]
        )
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("{")]
        value = json.loads(lines[-1]).get("value") if lines else None
        detail = (proc.stdout + proc.stderr).strip()[-600:]
        return GuestOutcome(ok=proc.returncode == 0, detail=detail, value=value)

    def start_long_guest(self, allocation: Allocation) -> str:
        handle = f"guest-{len(self._guests)}"
        argv = ["/usr/bin/python3", "-m", "conformance.guest", "counter", "--device", "/dev/kvm",
                "--state-file", f"/state/{handle}.json", "--interval", "0.05"]  # fmt: skip
        proc = subprocess.Popen(self._exec(allocation, argv), stdout=subprocess.DEVNULL)
        self.ledger.record_process(proc.pid, f"crictl exec of {handle}")
        self._guests[handle] = (proc, self._pods[id(allocation)])
        return handle

    def long_guest_counter(self, handle: str) -> int:
        proc, _ = self._guests[handle]
        assert proc.poll() is None, f"long-running guest {handle} exited {proc.returncode}"
        try:
            return int(json.loads((self.state / f"{handle}.json").read_text())["counter"])
        except (OSError, ValueError, KeyError):
            return 0


@contextlib.contextmanager
def open_node(
    ctx: RunContext, *, worker: str, metadata: object | None = None
) -> Iterator[RealNode]:
    """The registry's entry: the plugin under test as its profile describes it."""
    with set_up(RealNode(out_dir=ctx.out, worker=worker, plugin=ctx.plugin)) as node:
        yield node
