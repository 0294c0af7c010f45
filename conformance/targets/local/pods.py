"""Pods on the local node: the kubelet emulator's pods, whose containers are long KVM guests.

The emulator models what the kubelet does with pods (admission, re-admission after its restarts,
the pod-resources API, device health in pod status; conformance/kubelet/pods.py); this module is
the node's container runtime under it (a container is a counting guest started through the
CDI-resolving runtime emulation, its ID the guest's handle) and the pod half of the Node
contract. A node reboot is made here too: the kubelet and the plugin stopped as by a power cut,
every sandbox gone, then both started again, the device perhaps not yet usable.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
from pathlib import Path
from typing import Any

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api.wire import HEALTHY
from hvconform.contract.node import (
    Allocation,
    DeviceSpec,
    NodeEvent,
    PodResources,
    PodView,
)
from hvconform.kubelet import EventKind, PodRecord, ThreadedKubeletEmulator

STOP_TIMEOUT_S = 10.0


def _view(pod: PodRecord) -> PodView:
    return PodView(
        pod.uid, pod.name, pod.owner, pod.phase, pod.reason, pod.message, pod.container_id,
        pod.restart_count,
    )  # fmt: skip


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Stop a guest: `sig`, SIGKILL when it does not go, and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)


class LocalRuntime:
    """The container runtime the emulated kubelet drives (called from its loop's threads)."""

    def __init__(self, node: Any) -> None:
        self._node = node  # the LocalNode: its long guests are the containers

    def start_container(self, pod: PodRecord, response: pb.ContainerAllocateResponse) -> str:
        specs = [DeviceSpec(d.container_path, d.host_path, d.permissions) for d in response.devices]
        allocation = Allocation(
            ok=True,
            cdi_devices=[d.name for d in response.cdi_devices],
            device_specs=specs,
            envs=dict(response.envs),
        )
        handle: str = self._node.start_long_guest(allocation)
        return handle

    def running_containers(self) -> set[str]:
        guests: dict[str, subprocess.Popen[bytes]] = self._node._guests
        return {h for h, proc in list(guests.items()) if proc.poll() is None}

    def stop_container(self, container_id: str) -> None:
        proc = self._node._guests.get(container_id)
        if proc is not None:
            stop_process(proc)


class LocalPods:
    """Mixin of LocalNode: pods (CAP_PODS), pod device health, the kubelet's event record."""

    resource: str
    _guests: dict[str, subprocess.Popen[bytes]]

    def _kubelet(self) -> ThreadedKubeletEmulator:
        raise NotImplementedError

    def long_guest_counter(self, handle: str) -> int:
        raise NotImplementedError

    def start_pod(self, owner: str = "") -> PodView:
        return _view(self._kubelet().create_pod(self.resource, 1, owner))

    def pods(self) -> list[PodView]:
        return [_view(p) for p in self._kubelet().pods()]

    def _pod(self, uid: str) -> PodRecord:
        found = [p for p in self._kubelet().pods() if p.uid == uid]
        if not found:
            raise AssertionError(f"pod {uid} is not on this node")
        return found[0]

    def pod_counter(self, uid: str) -> int:
        pod = self._pod(uid)
        assert pod.container_id, f"pod {pod.name} has no container ({pod.phase} {pod.reason})"
        return self.long_guest_counter(pod.container_id)

    def delete_pod(self, uid: str) -> None:
        self._kubelet().delete_pod(uid)

    def delete_check_pods(self) -> None:
        """Every pod but the session guest's: what checks left is gone before the next."""
        for pod in self._kubelet().pods():
            if not pod.bare:
                self._kubelet().delete_pod(pod.uid)

    def pod_resources(self) -> PodResources:
        kubelet = self._kubelet()
        listed = kubelet.pod_devices()
        devices = {uid: held.get(self.resource, ()) for uid, held in listed.items()}
        healthy = kubelet.state(self.resource).healthy
        return PodResources(devices, tuple(sorted(healthy)))

    def pod_device_health(self, uid: str) -> dict[str, bool]:
        """allocatedResourcesStatus: Healthy, or not (Unhealthy, Unknown)."""
        return {dev: said == HEALTHY for dev, said in self._kubelet().device_health(uid).items()}

    def checkpoint_pod_uids(self) -> set[str]:
        return self._kubelet().checkpoint_pod_uids()

    def node_events(self, since: float) -> list[NodeEvent]:
        """The emulator's timeline for the plugin's resource, in the contract's words."""
        events: list[NodeEvent] = []
        for e in self._kubelet().timeline(since=since):
            if e.resource not in ("", self.resource):
                continue
            d = e.detail
            if e.kind == EventKind.REGISTERED:
                events.append(NodeEvent(e.t, "registered", detail=str(d.get("endpoint", ""))))
            elif e.kind == EventKind.SNAPSHOT:
                events.append(NodeEvent(e.t, "allocatable", int(str(d.get("healthy", 0)))))
            elif e.kind == EventKind.STREAM_ENDED and "allocatable" in d:  # a disconnect
                events.append(NodeEvent(e.t, "allocatable", int(str(d["allocatable"]))))
            elif e.kind in (EventKind.KUBELET_STARTED, EventKind.RESOURCE_REMOVED):
                events.append(NodeEvent(e.t, "allocatable", 0))  # no devices until a list
            elif e.kind == EventKind.ALLOCATED:
                events.append(NodeEvent(e.t, "admitted", detail=str(d.get("device_ids", ""))))
            elif e.kind == EventKind.ALLOCATION_FAILED:
                text = f"{d.get('reason', '')}: {d.get('message', '')}"
                events.append(NodeEvent(e.t, "refused", detail=text))
        return events


def kill_guests(guests: dict[str, subprocess.Popen[bytes]]) -> int:
    """SIGKILL every guest still running (a power cut); returns how many there were."""
    alive = [proc for proc in guests.values() if proc.poll() is None]
    for proc in alive:
        stop_process(proc, signal.SIGKILL)
    return len(alive)


def real_kvm_numbers() -> tuple[int, int]:
    rdev = os.stat("/dev/kvm").st_rdev
    return os.major(rdev), os.minor(rdev)


def null_node(state: Path) -> Path:
    """/dev/null's numbers at a path of the node's state: a node that is no hypervisor."""
    null = state / "null-at-kvm"
    if not null.exists():
        os.mknod(null, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    return null
