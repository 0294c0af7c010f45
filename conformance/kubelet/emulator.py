"""An in-process kubelet device manager: registration server, endpoints, admission, restarts.

Behaviour follows kubelet-device-manager.md (the real kubelet), with one deliberate fix:
re-registration closes the old stream and a late end of it never touches the new endpoint.
`emulate_stale_client_bug=True` restores the upstream behaviour (old stream left running; its
end disconnects whichever client is current) to test plugins against it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api import deviceplugin_pb2_grpc as pb_grpc

from . import checkpoint
from .accounting import (
    Accounting,
    AllocationRecord,
    EventKind,
    PluginOptions,
    RegistrationRecord,
    counts_wait,
)
from .admission import Admission, AllocationOutcome
from .client import EndpointError, PluginEndpoint
from .pods import ContainerRuntime, PodManager
from .sockets import KubeletSocket, RegistrationServicer, cleanup_plugin_dir
from .validation import (
    CHECKPOINT_NAME,
    DEPRECATION_NAME,
    KUBELET_SOCKET_NAME,
    PRESTART_TIMEOUT_S,
    go_join,
    resource_name_error,
    version_error,
)


class KubeletEmulator:
    """The kubelet side of the device plugin API, driven from one asyncio event loop."""

    def __init__(
        self,
        plugin_dir: Path,
        grace_period_s: float = 300.0,
        dial_timeout_s: float = 10.0,
        *,
        emulate_stale_client_bug: bool = False,
        prestart_timeout_s: float = PRESTART_TIMEOUT_S,
    ) -> None:
        self.plugin_dir = Path(plugin_dir).absolute()
        self.grace_period_s = grace_period_s
        self.dial_timeout_s = dial_timeout_s
        self.emulate_stale_client_bug = emulate_stale_client_bug
        self.prestart_timeout_s = prestart_timeout_s
        self.accounting = Accounting()
        self.generation = 0  # kubelet starts so far
        self.started_at: float | None = None  # monotonic time kubelet.sock was listening
        self._running = False
        self._socket = KubeletSocket(self.plugin_dir / KUBELET_SOCKET_NAME)
        self._endpoints: dict[str, PluginEndpoint] = {}
        self._superseded: set[PluginEndpoint] = set()
        self._grace: dict[str, asyncio.TimerHandle] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._admission = Admission(
            self.accounting, self._endpoints.get, self._write_checkpoint, prestart_timeout_s
        )
        # Pods, their re-admission and the controller: only with a container runtime attached.
        self.pods: PodManager | None = None

    def attach_runtime(self, runtime: ContainerRuntime) -> None:
        """Model pods from now on: allocate() records a bare pod, starts re-admit every pod."""
        self.pods = PodManager(
            self.accounting, self._admission, runtime, running=lambda: self._running,
            spawn=self._spawn,
        )  # fmt: skip

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET_NAME

    @property
    def checkpoint_path(self) -> Path:
        return self.plugin_dir / CHECKPOINT_NAME

    @property
    def running(self) -> bool:
        return self._running

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Kubelet start-up: dir, DEPRECATION, socket cleanup, checkpoint, listen."""
        if self._running:
            raise RuntimeError("kubelet emulator already running")
        self.plugin_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        (self.plugin_dir / DEPRECATION_NAME).write_bytes(b"")
        removed = cleanup_plugin_dir(self.plugin_dir)
        self.accounting.record(EventKind.SOCKETS_CLEANED, removed=removed)
        data = checkpoint.read(self.checkpoint_path)
        restored = sorted(data.registered) if data else []
        self.accounting.reset_for_start(restored, data.allocations if data else [])
        self._endpoints.clear()
        for resource in restored:
            # Checkpointed resources start as stopped endpoints: capacity 0, grace running.
            placeholder = PluginEndpoint.stopped_placeholder(resource)
            self._endpoints[resource] = placeholder
            self._schedule_grace(resource, placeholder)
        try:
            await self._socket.start(self._add_servicers)
        except BaseException:
            self._cancel_all_grace()
            raise
        self._running = True
        self.generation += 1
        self.started_at = time.monotonic()
        self.accounting.record(
            EventKind.KUBELET_STARTED, generation=self.generation, restored=restored
        )
        if self.pods is not None:
            await self.pods.readmit()

    async def stop(self, *, graceful: bool = True) -> None:
        """Stop; graceful removes kubelet.sock, a crash (graceful=False) leaves it behind."""
        if self._socket.server is None:
            return
        self._running = False
        if self.pods is not None:
            self.pods.sources_ready = False
        self._cancel_all_grace()
        endpoints = set(self._endpoints.values()) | self._superseded
        for ep in endpoints:
            ep.closing = True
        # The listener goes first: a dying kubelet answers no Register while its streams end,
        # as a process that exits drops its listening socket with its connections.
        await self._socket.stop(graceful)
        await asyncio.gather(*(ep.close() for ep in endpoints))
        while self._background:  # closing tasks may spawn more; drain until none is left
            tasks = list(self._background)
            await asyncio.gather(*tasks, return_exceptions=True)
            self._background.difference_update(tasks)
        self._endpoints.clear()
        self._superseded.clear()
        self.accounting.record(EventKind.KUBELET_STOPPED, graceful=graceful)

    async def restart(self, graceful: bool) -> None:
        """Stop (gracefully or as a crash) and start again."""
        await self.stop(graceful=graceful)
        await self.start()

    def _add_servicers(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_RegistrationServicer_to_server(
            RegistrationServicer(self._handle_register), server
        )

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- registration and streams ---------------------------------------------------------

    async def _handle_register(self, req: pb.RegisterRequest) -> str | None:
        """Register, in the kubelet's order; returns the error text or None."""
        resource = req.resource_name
        socket_path = go_join(str(self.plugin_dir), req.endpoint)
        requested = PluginOptions.from_pb(req.options) if req.HasField("options") else None
        options: PluginOptions | None = None
        ep: PluginEndpoint | None = None
        error = version_error(req.version) or resource_name_error(resource)
        if error is None:
            ep = PluginEndpoint(resource, socket_path)
            try:
                await ep.connect(self.dial_timeout_s)
                options = await ep.fetch_options()
            except EndpointError as err:
                error = str(err)
            except asyncio.CancelledError:
                await ep.close()
                raise
            if error is None and not self._running:
                error = "kubelet is shutting down"
            if error is not None:
                await ep.close()
        ok = error is None
        self.accounting.add_registration(
            RegistrationRecord(
                t=time.monotonic(),
                resource_name=resource,
                version=req.version,
                endpoint=req.endpoint,
                socket_path=socket_path,
                requested_options=requested,
                options=options,
                ok=ok,
                error=error or "",
                kubelet_generation=self.generation,
            )
        )
        if ep is not None and ok:
            self._install(ep)
        return error

    def _install(self, ep: PluginEndpoint) -> None:
        old = self._endpoints.get(ep.resource)
        self._endpoints[ep.resource] = ep
        self._cancel_grace(ep.resource)
        if old is not None:
            if self.emulate_stale_client_bug and not old.stopped:
                self._superseded.add(old)  # upstream leaves the old stream running
            else:
                old.closing = True  # its end (our own cancel) must not touch the new one
                self._spawn(old.close())
        ep.start_stream(self._on_snapshot, self._on_stream_end)

    def _on_snapshot(self, ep: PluginEndpoint, response: pb.ListAndWatchResponse) -> None:
        current = self._endpoints.get(ep.resource) is ep
        if ep.stopped or not (current or self.emulate_stale_client_bug):
            return
        self.accounting.apply_snapshot(ep.resource, response.devices)
        self._write_checkpoint()
        if self.pods is not None:
            self.pods.kick()  # a replacement pod may fit now

    def _on_stream_end(self, ep: PluginEndpoint, reason: str) -> None:
        current = self._endpoints.get(ep.resource)
        if ep is current and not ep.closing:
            self._disconnect(ep, reason)
            return
        was_superseded = ep in self._superseded
        self._superseded.discard(ep)
        hit_current = (
            was_superseded and not ep.closing and current is not None and not current.stopped
        )
        self.accounting.record(
            EventKind.STREAM_ENDED,
            ep.resource,
            reason=reason,
            stale=ep is not current,
            closed_by_kubelet=ep.closing,
            endpoint=ep.socket_path,
            disconnected_current=hit_current,
        )
        if hit_current and current is not None:
            # runClient: getClient(name) now returns the NEW client and disconnects it.
            self._disconnect(current, f"late end of superseded stream: {reason}")

    def _disconnect(self, ep: PluginEndpoint, reason: str) -> None:
        """PluginDisconnected: all devices unhealthy at once, grace period starts."""
        ep.stopped = True
        self.accounting.mark_unhealthy(ep.resource)
        self.accounting.record(
            EventKind.STREAM_ENDED,
            ep.resource,
            reason=reason,
            stale=False,
            endpoint=ep.socket_path,
            capacity=self.accounting.capacity(ep.resource),
            allocatable=self.accounting.allocatable(ep.resource),
        )
        self._write_checkpoint()
        self._schedule_grace(ep.resource, ep)
        self._spawn(ep.close_channel())

    async def end_stream(self, resource: str) -> float:
        """The kubelet's Recv on ListAndWatch fails with no restart (a broken connection): as
        client.go Run returns, handler.go runClient disconnects the endpoint: every device
        unhealthy at once, the grace period running, and nothing more read from that plugin
        until it registers again. Returns the monotonic time the stream was ended."""
        ep = self._endpoints.get(resource)
        if ep is None or ep.stopped:
            raise RuntimeError(f"no connected endpoint for {resource} whose stream could end")
        ended = time.monotonic()
        await ep.end_stream()
        return ended

    def _schedule_grace(self, resource: str, ep: PluginEndpoint) -> None:
        self._cancel_grace(resource)
        loop = asyncio.get_running_loop()
        self._grace[resource] = loop.call_later(
            self.grace_period_s, self._grace_expired, resource, ep
        )

    def _cancel_all_grace(self) -> None:
        for handle in self._grace.values():
            handle.cancel()
        self._grace.clear()

    def _cancel_grace(self, resource: str) -> None:
        handle = self._grace.pop(resource, None)
        if handle is not None:
            handle.cancel()

    def _grace_expired(self, resource: str, ep: PluginEndpoint) -> None:
        self._grace.pop(resource, None)
        if self._endpoints.get(resource) is not ep or not ep.stopped:
            return
        del self._endpoints[resource]
        self.accounting.remove_resource(resource)
        self.accounting.record(EventKind.RESOURCE_REMOVED, resource)
        self._write_checkpoint()

    def _write_checkpoint(self) -> None:
        registered = {r: self.accounting.state(r).healthy for r in self.accounting.resource_names()}
        payload = checkpoint.encode(registered, self.accounting.allocations())
        # The kubelet logs a failed checkpoint write and carries on.
        with contextlib.suppress(OSError):
            checkpoint.write(self.checkpoint_path, payload)

    # --- queries ----------------------------------------------------------------------------

    def capacity(self, resource: str) -> int:
        return self.accounting.capacity(resource)

    def allocatable(self, resource: str) -> int:
        return self.accounting.allocatable(resource)

    def registrations(self, resource: str) -> list[RegistrationRecord]:
        return self.accounting.registrations(resource)

    def allocations(self) -> list[AllocationRecord]:
        """podresources-like List: every container allocation with the plugin's full answer."""
        return self.accounting.allocations()

    def options(self, resource: str) -> PluginOptions | None:
        """Options of the current endpoint (from GetDevicePluginOptions)."""
        ep = self._endpoints.get(resource)
        return None if ep is None else ep.options

    def reregistration_latency(self, resource: str) -> float | None:
        """Seconds from the last kubelet start to the first successful Register after it."""
        if self.started_at is None:
            return None
        for event in self.accounting.timeline(EventKind.REGISTERED, resource, self.started_at):
            return event.t - self.started_at
        return None

    async def wait_for(
        self,
        predicate: Callable[[], bool],
        timeout: float,  # noqa: ASYNC109 - the named-wait contract (see Accounting.wait_for)
        description: str,
        observe: Callable[[], object] | None = None,
    ) -> None:
        await self.accounting.wait_for(predicate, timeout, description, observe)

    async def wait_for_counts(
        self,
        resource: str,
        *,
        capacity: int | None = None,
        allocatable: int | None = None,
        timeout: float,  # noqa: ASYNC109 - the named-wait contract (see Accounting.wait_for)
    ) -> None:
        """Wait until the resource reports the given capacity and/or allocatable."""
        predicate, description, observe = counts_wait(
            self.accounting, resource, capacity, allocatable
        )
        await self.accounting.wait_for(predicate, timeout, description, observe)

    # --- admission ------------------------------------------------------------------------

    async def allocate(
        self,
        resource: str,
        count: int = 1,
        container: str = "c0",
        *,
        pod_uid: str | None = None,
        rpc_timeout_s: float | None = None,
    ) -> AllocationOutcome:
        """Admit one container asking for `count` devices (see admission.py)."""
        if not self._running:
            raise RuntimeError("kubelet emulator is not running")
        uid = pod_uid or str(uuid.uuid4())
        if self.pods is not None:  # a bare pod, known to gc while its allocation is held
            self.pods.gc()
            self.pods.add_bare(resource, count, uid)
        outcome = await self._admission.allocate(
            resource, count, container, pod_uid=uid, rpc_timeout_s=rpc_timeout_s
        )
        if self.pods is not None:
            self.pods.bare_admitted(uid, outcome.ok)
        return outcome

    def release(self, allocation: AllocationRecord | int) -> bool:
        """Free an allocation's devices (the container ended); False if unknown."""
        if self.pods is not None:
            self.pods.forget_bare(allocation)  # its bare pod goes with it
        return self._admission.release(allocation)
