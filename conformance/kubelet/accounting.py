"""What the emulated kubelet knows: per-resource devices, registrations, allocations, timeline.

Mutations come from the emulator's event loop; reads and waits may come from any thread, so
all state sits behind one lock and every change wakes both thread and asyncio waiters.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api.wire import HEALTHY


class EventKind(enum.StrEnum):
    """Kinds of timeline events."""

    KUBELET_STARTED = "kubelet_started"
    KUBELET_STOPPED = "kubelet_stopped"
    SOCKETS_CLEANED = "sockets_cleaned"
    REGISTERED = "registered"
    REGISTRATION_FAILED = "registration_failed"
    SNAPSHOT = "snapshot"
    STREAM_ENDED = "stream_ended"
    RESOURCE_REMOVED = "resource_removed"
    ALLOCATED = "allocated"
    ALLOCATION_FAILED = "allocation_failed"
    RELEASED = "released"
    POD = "pod"  # a pod's phase changed (pods.py)


@dataclass(frozen=True)
class TimelineEvent:
    """One thing that happened, stamped with time.monotonic()."""

    t: float
    kind: EventKind
    resource: str = ""
    detail: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class PluginOptions:
    """DevicePluginOptions as plain values."""

    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False

    @classmethod
    def from_pb(cls, options: pb.DevicePluginOptions) -> PluginOptions:
        return cls(options.pre_start_required, options.get_preferred_allocation_available)


@dataclass(frozen=True)
class RegistrationRecord:
    """One Register call as the kubelet handled it (ok or not)."""

    t: float
    resource_name: str
    version: str
    endpoint: str
    socket_path: str
    requested_options: PluginOptions | None
    options: PluginOptions | None  # what GetDevicePluginOptions answered: the ones that count
    ok: bool
    error: str
    kubelet_generation: int


@dataclass(frozen=True)
class AllocationRecord:
    """A podresources-like entry: which devices one container got and the plugin's answer."""

    alloc_id: int
    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    response: pb.ContainerAllocateResponse
    t: float
    restored: bool = False  # read back from the checkpoint after a kubelet restart


@dataclass(frozen=True)
class ResourceState:
    """Counts and device sets of one resource as node status would report them."""

    capacity: int
    allocatable: int
    healthy: frozenset[str]
    unhealthy: frozenset[str]


class WaitTimeout(TimeoutError):
    """A wait expired; names the wait and the last value it saw."""

    def __init__(self, description: str, timeout: float, last_observed: object) -> None:
        super().__init__(
            f"timed out after {timeout:g} s waiting for {description}; "
            f"last observed: {last_observed!r}"
        )
        self.description = description
        self.timeout = timeout
        self.last_observed = last_observed


@dataclass
class _Devices:
    healthy: set[str] = field(default_factory=set)
    unhealthy: set[str] = field(default_factory=set)


class Accounting:
    """Thread-safe device-manager state with waits that always have a deadline."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._devices: dict[str, _Devices] = {}
        # allDevices: each device's health as last advertised. A disconnect does not touch it
        # (markResourceUnhealthy moves only the healthy set), so pod status keeps saying Healthy.
        self._advertised: dict[str, dict[str, str]] = {}
        self._registrations: dict[str, list[RegistrationRecord]] = {}
        self._allocations: dict[int, AllocationRecord] = {}
        self._reserved: dict[str, set[str]] = {}
        self._timeline: list[TimelineEvent] = []
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._next_alloc_id = 1

    # --- mutations (emulator loop) -------------------------------------------------------

    def record(self, kind: EventKind, resource: str = "", **detail: object) -> TimelineEvent:
        """Append a timeline event and wake waiters."""
        with self._lock:
            event = TimelineEvent(time.monotonic(), kind, resource, dict(detail))
            self._timeline.append(event)
            self._changed()
            return event

    def apply_snapshot(self, resource: str, devices: Iterable[pb.Device]) -> TimelineEvent:
        """Replace a resource's devices with a full ListAndWatch snapshot."""
        healthy: set[str] = set()
        unhealthy: set[str] = set()
        seen: set[str] = set()
        duplicates: set[str] = set()
        advertised: dict[str, str] = {}
        for dev in devices:
            advertised[dev.ID] = dev.health
            if dev.ID in seen:
                duplicates.add(dev.ID)
            seen.add(dev.ID)
            # Only the exact string counts; "healthy" or "" is unhealthy, as in the kubelet.
            (healthy if dev.health == HEALTHY else unhealthy).add(dev.ID)
        with self._lock:
            self._devices[resource] = _Devices(healthy, unhealthy)
            self._advertised[resource] = advertised
            return self.record(
                EventKind.SNAPSHOT,
                resource,
                healthy=len(healthy),
                unhealthy=len(unhealthy),
                capacity=len(healthy) + len(unhealthy),
                duplicates=sorted(duplicates),
            )

    def mark_unhealthy(self, resource: str) -> None:
        """Endpoint disconnected: every device of the resource becomes unhealthy at once."""
        with self._lock:
            # Like markResourceUnhealthy: a resource with no snapshot yet becomes known, empty.
            devs = self._devices.setdefault(resource, _Devices())
            devs.unhealthy |= devs.healthy
            devs.healthy = set()
            self._changed()

    def remove_resource(self, resource: str) -> bool:
        """Grace period over: forget the resource (reported as capacity 0)."""
        with self._lock:
            removed = self._devices.pop(resource, None) is not None
            self._changed()
            return removed

    def reset_for_start(
        self, checkpoint_resources: Iterable[str], allocations: Iterable[AllocationRecord]
    ) -> None:
        """Kubelet start: only checkpointed resources survive, each with no devices."""
        with self._lock:
            self._devices = {name: _Devices() for name in checkpoint_resources}
            self._advertised = {}
            self._allocations = {a.alloc_id: a for a in allocations}
            self._reserved = {}
            if self._allocations:
                self._next_alloc_id = max(self._next_alloc_id, max(self._allocations) + 1)
            self._changed()

    def add_registration(self, rec: RegistrationRecord) -> None:
        with self._lock:
            self._registrations.setdefault(rec.resource_name, []).append(rec)
            kind = EventKind.REGISTERED if rec.ok else EventKind.REGISTRATION_FAILED
            self.record(kind, rec.resource_name, endpoint=rec.endpoint, error=rec.error)

    def reserve(self, resource: str, device_ids: Iterable[str]) -> None:
        """Hold devices while an Allocate call is in flight."""
        with self._lock:
            self._reserved.setdefault(resource, set()).update(device_ids)

    def unreserve(self, resource: str, device_ids: Iterable[str]) -> None:
        with self._lock:
            self._reserved.get(resource, set()).difference_update(device_ids)

    def add_allocation(
        self,
        pod_uid: str,
        container: str,
        resource: str,
        device_ids: Iterable[str],
        response: pb.ContainerAllocateResponse,
    ) -> AllocationRecord:
        with self._lock:
            ids = tuple(device_ids)
            rec = AllocationRecord(
                self._next_alloc_id, pod_uid, container, resource, ids, response, time.monotonic()
            )
            self._next_alloc_id += 1
            self._allocations[rec.alloc_id] = rec
            self.unreserve(resource, ids)
            self.record(EventKind.ALLOCATED, resource, container=container, device_ids=list(ids))
            return rec

    def release(self, alloc_id: int) -> AllocationRecord | None:
        with self._lock:
            rec = self._allocations.pop(alloc_id, None)
            if rec is not None:
                self.record(EventKind.RELEASED, rec.resource, device_ids=list(rec.device_ids))
            return rec

    # --- queries (any thread) ---------------------------------------------------------------

    def capacity(self, resource: str) -> int:
        """Node status capacity: healthy + unhealthy devices; 0 when unknown or removed."""
        with self._lock:
            devs = self._devices.get(resource)
            return 0 if devs is None else len(devs.healthy) + len(devs.unhealthy)

    def allocatable(self, resource: str) -> int:
        """Node status allocatable: healthy devices only."""
        with self._lock:
            devs = self._devices.get(resource)
            return 0 if devs is None else len(devs.healthy)

    def resource_names(self) -> list[str]:
        """Resources the kubelet currently knows (removed ones are gone)."""
        with self._lock:
            return sorted(self._devices)

    def state(self, resource: str) -> ResourceState:
        with self._lock:
            devs = self._devices.get(resource, _Devices())
            return ResourceState(
                len(devs.healthy) + len(devs.unhealthy),
                len(devs.healthy),
                frozenset(devs.healthy),
                frozenset(devs.unhealthy),
            )

    def advertised_health(self, resource: str, device_id: str) -> str | None:
        """The device's health in the plugin's last list; None when it never advertised it."""
        with self._lock:
            return self._advertised.get(resource, {}).get(device_id)

    def summary(self) -> dict[str, tuple[int, int]]:
        """resource -> (capacity, allocatable); the default 'last observed' of a wait."""
        with self._lock:
            return {r: (self.capacity(r), self.allocatable(r)) for r in sorted(self._devices)}

    def in_use(self, resource: str) -> set[str]:
        """Device IDs allocated to containers or reserved by an in-flight Allocate."""
        with self._lock:
            used = set(self._reserved.get(resource, set()))
            for rec in self._allocations.values():
                if rec.resource == resource:
                    used.update(rec.device_ids)
            return used

    def registrations(self, resource: str) -> list[RegistrationRecord]:
        with self._lock:
            return list(self._registrations.get(resource, []))

    def registered_resources(self) -> list[str]:
        """Resource names with at least one accepted Register call, first registered first."""
        with self._lock:
            done = [
                (min(r.t for r in recs if r.ok), name)
                for name, recs in self._registrations.items()
                if any(r.ok for r in recs)
            ]
        return [name for _, name in sorted(done)]

    def allocations(self) -> list[AllocationRecord]:
        with self._lock:
            return sorted(self._allocations.values(), key=lambda a: a.alloc_id)

    def timeline(
        self, kind: EventKind | None = None, resource: str | None = None, since: float = 0.0
    ) -> list[TimelineEvent]:
        with self._lock:
            return [
                e
                for e in self._timeline
                if (kind is None or e.kind == kind)
                and (resource is None or e.resource == resource)
                and e.t >= since
            ]

    # --- waits ---------------------------------------------------------------------------

    def _changed(self) -> None:
        self._cond.notify_all()
        waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            # A closed loop raises RuntimeError: nobody is waiting there any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, fut)

    def _observe(self, observe: Callable[[], object] | None) -> object:
        return observe() if observe is not None else self.summary()

    async def wait_for(
        self,
        predicate: Callable[[], bool],
        timeout: float,  # noqa: ASYNC109 - same named-wait contract as wait_for_blocking
        description: str,
        observe: Callable[[], object] | None = None,
    ) -> None:
        """Wait (asyncio) until predicate() holds; WaitTimeout after `timeout` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            fut: asyncio.Future[None] = loop.create_future()
            with self._lock:
                if predicate():
                    return
                self._waiters.append((loop, fut))
            remaining = deadline - loop.time()
            try:
                if remaining <= 0:
                    raise TimeoutError
                async with asyncio.timeout(remaining):
                    await fut
            except TimeoutError:
                with self._lock:
                    if predicate():
                        return
                    raise WaitTimeout(description, timeout, self._observe(observe)) from None

    def wait_for_blocking(
        self,
        predicate: Callable[[], bool],
        timeout: float,
        description: str,
        observe: Callable[[], object] | None = None,
    ) -> None:
        """Thread version of wait_for; never call it on the emulator's event loop thread."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WaitTimeout(description, timeout, self._observe(observe))
                self._cond.wait(remaining)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def counts_wait(
    accounting: Accounting, resource: str, capacity: int | None, allocatable: int | None
) -> tuple[Callable[[], bool], str, Callable[[], object]]:
    """(predicate, description, observe) for 'resource reports these counts'."""
    wanted = {"capacity": capacity, "allocatable": allocatable}
    wanted_text = ", ".join(f"{k}={v}" for k, v in wanted.items() if v is not None)

    def observe() -> dict[str, int]:
        return {
            "capacity": accounting.capacity(resource),
            "allocatable": accounting.allocatable(resource),
        }

    def predicate() -> bool:
        seen = observe()
        return all(v is None or seen[k] == v for k, v in wanted.items())

    return predicate, f"{resource} to report {wanted_text or 'anything'}", observe
