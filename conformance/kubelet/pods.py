"""Pods on the emulated node, as the kubelet handles them, across its own restarts too.

The API server's pods bound to this node live here and outlive kubelet restarts; containers are
the target's (`ContainerRuntime`, CRI reduced to what the device manager's flows need). What the
kubelet does with them follows v1.37.2 `pkg/kubelet/cm/devicemanager/manager.go`:

- At start every active pod goes through admission again (`readmit`, devicesToAllocate). A
  container holding devices in the checkpoint needs no Allocate. While the kubelet's sources are
  not ready and the runtime reports that container running (isContainerAlreadyRunning, the fix
  of kubernetes/kubernetes#118559) it is left alone; otherwise the resource must be registered
  and every device it holds healthy, else the pod fails with UnexpectedAdmissionError: a node
  reboot, whose sandboxes are gone, before the plugin is back (e2e_node device_plugin_test.go,
  "Does not keep device plugin assignments across node reboots if fails admission").
- UpdateAllocatedDevices (`gc`): the devices of pods no longer active are freed once sources are
  ready, at each admission and each pod-resources List; the checkpoint follows at its next write.
A ReplicaSet-like controller and a scheduler stand in for the control plane: an owned pod that
failed is replaced by a new pod (new UID), bound once the node has a free healthy device, with
the controller's growing delay between failures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api.wire import HEALTHY, UNHEALTHY

from .accounting import Accounting, AllocationRecord, EventKind
from .admission import (
    PHASE_FAILED,
    PHASE_PENDING,
    PHASE_RUNNING,
    REASON_ADMISSION,
    Admission,
    admission_error,
)

# The container could not be created (its CDI device unresolvable, say): the pod stays Pending.
REASON_CREATE = "CreateContainerError"
# The controller's delay before replacing a failed pod, doubling per consecutive failure: an
# admission-error loop (squat/generic-device-plugin#63) is bounded, never a busy loop.
CONTROLLER_BACKOFF_S = 0.1
CONTROLLER_BACKOFF_MAX_S = 2.0


@dataclass
class PodRecord:
    """One pod with one container requesting `count` devices of `resource`."""

    uid: str
    name: str
    resource: str
    count: int = 1
    container: str = "c0"
    owner: str = ""  # the controller that replaces it when it fails ("": a bare pod)
    phase: str = PHASE_PENDING
    reason: str = ""
    message: str = ""
    container_id: str = ""
    restart_count: int = 0
    bound: bool = True  # scheduled to this node (a replacement waits for a free device)
    bare: bool = False  # admitted through allocate(): its container is the caller's to start

    @property
    def active(self) -> bool:
        """What GetActivePods returns: bound and not terminal."""
        return self.bound and self.phase != PHASE_FAILED


class ContainerRuntime(Protocol):
    """The node's container runtime as the kubelet uses it; called off the event loop."""

    def start_container(self, pod: PodRecord, response: pb.ContainerAllocateResponse) -> str:
        """Start the pod's container with its Allocate answer; returns the container ID."""
        ...

    def running_containers(self) -> set[str]: ...
    def stop_container(self, container_id: str) -> None: ...


class PodManager:
    """The kubelet's pods and the control plane's controller, on the emulator's loop."""

    def __init__(
        self,
        accounting: Accounting,
        admission: Admission,
        runtime: ContainerRuntime,
        *,
        running: Callable[[], bool],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self._acct = accounting
        self._admission = admission
        self._runtime = runtime
        self._running = running
        self._spawn = spawn
        self._pods: dict[str, PodRecord] = {}
        self._lock = threading.RLock()  # reads come from other threads
        self._names = itertools.count(1)
        self._failures: dict[str, int] = {}  # owner -> consecutive failed pods
        self._scaled_down: set[str] = set()  # owners whose pods were deleted: not replaced
        self._scheduling = asyncio.Lock()
        self.sources_ready = False

    # --- the API's side ---------------------------------------------------------------------

    def _new(self, resource: str, count: int, owner: str, *, bound: bool, bare: bool) -> PodRecord:
        name = f"{owner or 'pod'}-{next(self._names)}"
        pod = PodRecord(str(uuid.uuid4()), name, resource, count, owner=owner, bound=bound)
        pod.bare = bare
        with self._lock:
            self._pods[pod.uid] = pod
        return pod

    async def create(self, resource: str, count: int = 1, owner: str = "") -> PodRecord:
        """A pod bound to this node (nodeName set); admitted now when the kubelet runs."""
        self._scaled_down.discard(owner)
        pod = self._new(resource, count, owner, bound=True, bare=False)
        if self._running():
            await self._admit(pod)
        return self.get(pod.uid) or pod

    def add_bare(self, resource: str, count: int, uid: str) -> None:
        """allocate()'s pod: active while its allocation is held, so gc keeps it."""
        pod = PodRecord(uid, f"alloc-{next(self._names)}", resource, count, bare=True)
        with self._lock:
            self._pods[uid] = pod

    def bare_admitted(self, uid: str, ok: bool) -> None:
        with self._lock:
            pod = self._pods.get(uid)
            if pod is None:
                return
            if ok:
                pod.phase = PHASE_RUNNING
            else:
                del self._pods[uid]  # a refused request, not a pod worth keeping

    def forget_bare(self, allocation: AllocationRecord | int) -> None:
        """allocate()'s allocation released: its bare pod is gone (a pod of its own stays)."""
        alloc_id = allocation if isinstance(allocation, int) else allocation.alloc_id
        uids = {r.pod_uid for r in self._acct.allocations() if r.alloc_id == alloc_id}
        with self._lock:
            for uid in uids:
                if uid in self._pods and self._pods[uid].bare:
                    del self._pods[uid]

    def container_started(self, uid: str, container_id: str) -> None:
        """The caller started a bare pod's container (the runtime now reports it running)."""
        with self._lock:
            pod = self._pods.get(uid)
            if pod is not None:
                pod.container_id = container_id

    async def delete(self, uid: str) -> None:
        """The pod is deleted (its owner scaled it away: no replacement). A running kubelet
        kills its container; a stopped one never hears of it, and kills what is left when it
        starts. Its devices are freed by the next gc, as the kubelet does."""
        with self._lock:
            pod = self._pods.pop(uid, None)
        if pod is not None and pod.owner:
            self._scaled_down.add(pod.owner)  # a replacement already due is not made either
        if pod is not None and self._running() and pod.container_id and not pod.bare:
            await asyncio.to_thread(self._runtime.stop_container, pod.container_id)

    def get(self, uid: str) -> PodRecord | None:
        with self._lock:
            pod = self._pods.get(uid)
            return None if pod is None else dataclasses.replace(pod)

    def pods(self) -> list[PodRecord]:
        with self._lock:
            return [dataclasses.replace(p) for p in self._pods.values()]

    def _active(self) -> list[PodRecord]:
        with self._lock:
            return [p for p in self._pods.values() if p.active]

    # --- the kubelet's side ----------------------------------------------------------------

    def gc(self) -> None:
        """UpdateAllocatedDevices: free what pods no longer active hold, once sources are ready."""
        if not self.sources_ready:
            return
        active = {p.uid for p in self._active()}
        for rec in self._acct.allocations():
            if rec.pod_uid not in active:
                self._acct.release(rec.alloc_id)

    async def _admit(self, pod: PodRecord) -> None:
        """A new admission: Allocate through the plugin, then the container."""
        self.gc()
        outcome = await self._admission.allocate(
            pod.resource, pod.count, pod.container, pod_uid=pod.uid
        )
        if not outcome.ok or outcome.response is None:
            await self._fail(pod, outcome.reason, outcome.message, outcome.phase)
            return
        await self._start(pod, outcome.response)

    async def _start(self, pod: PodRecord, response: pb.ContainerAllocateResponse) -> None:
        if pod.bare:
            pod.phase = PHASE_RUNNING
            self._changed(pod)
            return
        try:
            cid = await asyncio.to_thread(
                self._runtime.start_container, dataclasses.replace(pod), response
            )
        except Exception as err:  # any runtime failure is the pod's status, as CRI reports it
            pod.phase, pod.reason, pod.message = PHASE_PENDING, REASON_CREATE, str(err)
            self._changed(pod)
            return
        with self._lock:
            pod.restart_count += 1 if pod.container_id else 0
            pod.container_id, pod.phase, pod.reason, pod.message = cid, PHASE_RUNNING, "", ""
        self._failures.pop(pod.owner, None)
        self._changed(pod)

    def _changed(self, pod: PodRecord) -> None:
        """On the timeline, which also wakes every wait on the emulator's state."""
        self._acct.record(
            EventKind.POD, pod.resource, uid=pod.uid, name=pod.name, phase=pod.phase,
            reason=pod.reason, container_id=pod.container_id,
        )  # fmt: skip

    async def _fail(self, pod: PodRecord, reason: str, message: str, phase: str) -> None:
        with self._lock:
            pod.phase, pod.reason, pod.message = phase, reason, message
        self._changed(pod)
        if phase != PHASE_FAILED:
            return
        if pod.container_id and not pod.bare:  # a rejected pod's containers are killed
            await asyncio.to_thread(self._runtime.stop_container, pod.container_id)
        if pod.owner:
            self._replace_later(pod)

    def _held(self, pod: PodRecord) -> AllocationRecord | None:
        for rec in self._acct.allocations():
            key = (rec.pod_uid, rec.container, rec.resource)
            if key == (pod.uid, pod.container, pod.resource):
                return rec
        return None

    def _prior_devices_error(self, pod: PodRecord, held: AllocationRecord, alive: bool) -> str:
        """devicesToAllocate for a container that already holds devices; "" when admitted."""
        res = pod.resource
        if pod.count != len(held.device_ids):
            return (
                f'pod "{pod.uid}" container "{pod.container}" changed request for resource '
                f'"{res}" from {len(held.device_ids)} to {pod.count}'
            )
        if not self.sources_ready and alive:
            return ""  # a kubelet restart: the running container already has its devices
        healthy = self._acct.state(res).healthy
        if res not in self._acct.resource_names():
            return f"cannot allocate unregistered device {res}"
        if not healthy:
            return f"no healthy devices present; cannot allocate unhealthy devices {res}"
        if not healthy.issuperset(held.device_ids):
            return (
                "previously allocated devices are no longer healthy; "
                f"cannot allocate unhealthy devices {res}"
            )
        return ""

    async def readmit(self) -> None:
        """Kubelet start: every active pod through admission again, sources not yet ready;
        then the containers of pods that are gone are killed and sources become ready."""
        self.sources_ready = False
        running = await asyncio.to_thread(self._runtime.running_containers)
        for pod in self._active():
            held = self._held(pod)
            if held is None:
                await self._admit(pod)  # bound while the kubelet was down: a new admission
                continue
            alive = bool(pod.container_id) and pod.container_id in running
            error = self._prior_devices_error(pod, held, alive)
            if error:
                message = admission_error(error)
                self._acct.record(
                    EventKind.ALLOCATION_FAILED, pod.resource, reason=REASON_ADMISSION,
                    message=message, pod_uid=pod.uid, readmission=True,
                )  # fmt: skip
                await self._fail(pod, REASON_ADMISSION, message, PHASE_FAILED)
            elif not alive:
                await self._start(pod, held.response)  # GetDeviceRunContainerOptions: no RPC
        keep = {p.container_id for p in self._active()}
        for orphan in sorted(running - keep):
            await asyncio.to_thread(self._runtime.stop_container, orphan)
        self.sources_ready = True
        self.kick()

    # --- the control plane's side ----------------------------------------------------------

    def _replace_later(self, pod: PodRecord) -> None:
        failures = self._failures[pod.owner] = self._failures.get(pod.owner, 0) + 1
        delay = min(CONTROLLER_BACKOFF_S * 2 ** (failures - 1), CONTROLLER_BACKOFF_MAX_S)
        asyncio.get_running_loop().call_later(
            delay, self._replacement_due, pod.owner, pod.resource, pod.count
        )

    def _replacement_due(self, owner: str, resource: str, count: int) -> None:
        if owner in self._scaled_down:
            return
        self._new(resource, count, owner, bound=False, bare=False)
        self.kick()

    def kick(self) -> None:
        """Something changed (devices, a kubelet start, a new pod): bind what now fits."""
        if self._running():
            self._spawn(self._schedule())

    async def _schedule(self) -> None:
        async with self._scheduling:
            with self._lock:
                waiting = [p for p in self._pods.values() if not p.bound]
            for pod in waiting:
                if not self._running():
                    return
                free = self._acct.state(pod.resource).healthy - self._acct.in_use(pod.resource)
                if len(free) < pod.count or self.get(pod.uid) is None:
                    continue
                pod.bound = True
                await self._admit(pod)

    # --- what the kubelet reports ----------------------------------------------------------

    def list_devices(self) -> dict[str, dict[str, tuple[str, ...]]]:
        """pod-resources List (server_v1.go): active pods only (a failed admission is not
        listed, kubernetes/kubernetes#132028), after UpdateAllocatedDevices; uid -> resource ->
        device IDs of its container."""
        self.gc()
        listed: dict[str, dict[str, tuple[str, ...]]] = {p.uid: {} for p in self._active()}
        for rec in self._acct.allocations():
            if rec.pod_uid in listed:
                listed[rec.pod_uid][rec.resource] = rec.device_ids
        return listed

    def device_health(self, uid: str) -> dict[str, str]:
        """allocatedResourcesStatus of the pod's container (KEP-4680,
        UpdateAllocatedResourcesStatus): each device's last advertised health, Healthy when
        the plugin never named it; "Unhealthy" for any other string."""
        health: dict[str, str] = {}
        for rec in self._acct.allocations():
            if rec.pod_uid != uid:
                continue
            for dev in rec.device_ids:
                said = self._acct.advertised_health(rec.resource, dev)
                health[dev] = HEALTHY if said in (None, HEALTHY) else UNHEALTHY
        return health
