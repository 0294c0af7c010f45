"""What the real kubelet did, in order, as the Node contract's typed NodeEvents.

The emulator keeps a timeline of its own; the real kubelet keeps none a harness can read, so a
thread samples what it answers, typed, and records each change with the time it was seen:

- "allocatable": the device manager's healthy devices of the plugin's resource, from the
  pod-resources API's GetAllocatableResources (v1.37.2 manager.go `GetAllocatableDevices`:
  every known device filtered by the healthy set). Not the Node's status: that copy is written
  once a second and, after a reboot, still shows the devices from before until the kubelet's
  first status update. No answer (the kubelet down) is no observation, never a 0. The API is
  rate limited (podresources/constants.go: 100 per second, a burst of 10): sampled at 20.
- "admitted" / "refused": a pod on the node first seen Running, or Failed with a reason
  (UnexpectedAdmissionError: the device manager refused it), from the pod's status fields.

One change no sampling within that limit sees: a disconnected endpoint (manager.go
`PluginDisconnected` -> `markResourceUnhealthy`, every device unhealthy) that a plugin answers
by registering again within a few milliseconds (this repository's plugin: 3-5 ms, its new list
a few ms later). The kubelet records that moment only in its log, at -v=2, as one structured
line ("Mark all resources Unhealthy for resource" resourceName=...): that line, with its
microsecond timestamp, is read as the "allocatable" 0 it is. No other status is read from a log.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from hvconform.contract.node import NodeEvent
from hvconform.targets.realnode import NODE_NAME, PODRESOURCES_SOCKET
from hvconform.targets.realnode.configs import NAMESPACE
from hvconform.targets.realnode.kubeapi import Api, ApiError, allocatable_devices

SAMPLE_EVERY_S = 0.05  # 20 of the kubelet's 100 pod-resources calls a second
BURST_EVERY_S = 0.02  # 50 a second while a fault is watched: the checks' own calls fit beside
PODS_EVERY_S = 0.25
CALL_TIMEOUT_S = 2.0
UNHEALTHY = "Mark all resources Unhealthy for resource"  # manager.go `markResourceUnhealthy`
_KLOG = re.compile(r"^[IWEF](\d{4} \d{2}:\d{2}:\d{2}\.\d{6})")


def klog_monotonic(line: str) -> float | None:
    """A klog line's timestamp (the kubelet's, this host's clock: UTC here) as monotonic time."""
    m = _KLOG.match(line)
    if m is None:
        return None
    year = datetime.now(UTC).year
    wall = datetime.strptime(f"{year}{m.group(1)}", "%Y%m%d %H:%M:%S.%f").replace(tzinfo=UTC)
    return wall.timestamp() - (time.time() - time.monotonic())


class NodeEventLog:
    """A daemon thread recording the kubelet's allocatable and admissions as NodeEvents."""

    def __init__(self, api: Api, resource: Callable[[], str], kubelet_log: Path) -> None:
        self._api = api
        self._resource = resource
        self._log = kubelet_log
        self._log_at = kubelet_log.stat().st_size if kubelet_log.exists() else 0
        self._events: list[NodeEvent] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._burst_until = 0.0
        self._allocatable: int | None = None
        self._pods: dict[str, tuple[str, str]] = {}  # uid -> (phase, reason) last seen
        self._channel: grpc.Channel | None = None
        self._thread = threading.Thread(target=self._run, name="node-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        if self._channel is not None:
            self._channel.close()

    def events(self, since: float) -> list[NodeEvent]:
        self._read_kubelet_log()
        with self._lock:
            return sorted((e for e in self._events if e.t >= since), key=lambda e: e.t)

    def burst(self, seconds: float) -> None:
        """Sample allocatable as fast as possible for `seconds` from now."""
        self._burst_until = time.monotonic() + seconds

    def allocatable_seen(self, value: int, since: float) -> bool:
        return any(e.kind == "allocatable" and e.value == value for e in self.events(since))

    # -- the thread -----------------------------------------------------------------------

    def _record(self, event: NodeEvent) -> None:
        with self._lock:
            self._events.append(event)

    def _run(self) -> None:
        next_pods = 0.0
        while not self._stop.is_set():
            self._sample_allocatable()
            now = time.monotonic()
            if now >= next_pods:
                self._sample_pods()
                next_pods = now + PODS_EVERY_S
            bursting = time.monotonic() < self._burst_until
            self._stop.wait(BURST_EVERY_S if bursting else SAMPLE_EVERY_S)

    def _call(self) -> bytes | None:
        """GetAllocatableResources on a kept channel; a new one after any failure (a restarted
        kubelet makes a new socket, and a failed channel would retry it with backoff)."""
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{PODRESOURCES_SOCKET}")
        call = self._channel.unary_unary(
            "/v1.PodResourcesLister/GetAllocatableResources",
            request_serializer=lambda _: b"",
            response_deserializer=lambda raw: raw,
        )
        try:
            raw: bytes = call(b"", timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:  # the rate limit: ask later
                self._channel.close()
                self._channel = None
            return None
        return raw

    def _read_kubelet_log(self) -> None:
        """The kubelet's disconnect records written since the last read (whole lines only)."""
        resource = self._resource()
        try:
            with self._log.open("rb") as log:
                log.seek(self._log_at)
                chunk = log.read()
        except OSError:
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._log_at += len(complete)
        ours = f'resourceName="{resource}"'
        for line in complete.decode(errors="replace").splitlines():
            if UNHEALTHY in line and ours in line and (t := klog_monotonic(line)) is not None:
                self._record(NodeEvent(t, "allocatable", 0, detail="kubelet: " + UNHEALTHY))

    def _sample_allocatable(self) -> None:
        raw = self._call()
        resource = self._resource()
        if raw is None or not resource:
            return
        value = len(allocatable_devices(raw).get(resource, []))
        if value != self._allocatable:
            self._allocatable = value
            self._record(NodeEvent(time.monotonic(), "allocatable", value))

    def _sample_pods(self) -> None:
        try:
            listed: dict[str, Any] = self._api.get(
                f"/api/v1/namespaces/{NAMESPACE}/pods?fieldSelector=spec.nodeName%3D{NODE_NAME}"
            )
        except (ApiError, OSError):
            return
        seen = time.monotonic()
        for pod in listed.get("items", []):
            uid = pod["metadata"]["uid"]
            status = pod.get("status", {})
            phase, reason = status.get("phase", ""), status.get("reason", "")
            if self._pods.get(uid) == (phase, reason):
                continue
            self._pods[uid] = (phase, reason)
            name = pod["metadata"]["name"]
            if phase == "Running":
                self._record(NodeEvent(seen, "admitted", detail=name))
            elif phase == "Failed" and reason:
                detail = f"{reason}: {status.get('message', '')}"
                self._record(NodeEvent(seen, "refused", detail=detail))
