"""The v1beta1 DevicePlugin servicer: options, ListAndWatch, preferred allocation, Allocate."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Sequence

import grpc

from hv_device_plugin import metrics
from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api import deviceplugin_pb2_grpc as pb_grpc
from hv_device_plugin.api.wire import HEALTHY, UNHEALTHY
from hv_device_plugin.config import Config
from hv_device_plugin.health import HealthState
from hv_device_plugin.logs import log, warn
from hv_device_plugin.monitor import Monitor
from hv_device_plugin.request_checks import (
    Unread,
    allocate_problem,
    max_allocate_bytes,
    preferred_problem,
    reader,
    show_ids,
)

SERVICE = "v1beta1.DevicePlugin"
# How long a health change may wait for the Allocates in flight when it happened (see
# _answers_first); bounded so that a steady stream of allocations cannot hold it back.
ANSWERS_FIRST_S = 0.05


def device_ids(cfg: Config) -> list[str]:
    if cfg.mode == "device-access":
        return [f"{cfg.device_name}-access"]
    return [f"{cfg.device_name}-{i}" for i in range(cfg.slots)]


def _index(device_id: str) -> tuple[int, str]:
    tail = device_id.rsplit("-", 1)[-1]
    return (int(tail), device_id) if tail.isdigit() else (1 << 62, device_id)


def preferred(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """Deterministic choice: the required IDs, then the lowest-numbered available ones."""
    chosen = list(dict.fromkeys(must_include))[:size]
    for device_id in sorted(set(available) - set(chosen), key=_index):
        if len(chosen) >= size:
            break
        chosen.append(device_id)
    return chosen


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    """Serves one resource; health comes from the shared HealthState only."""

    def __init__(self, cfg: Config, health: HealthState, monitor: Monitor) -> None:
        self._cfg = cfg
        self._health = health
        self._monitor = monitor
        self._ids = device_ids(cfg)
        self._known = frozenset(self._ids)
        # The kubelet never names more IDs than the node's capacity in one request.
        self._limit = len(self._ids)
        self._cdi_name = f"{cfg.resource_name}={cfg.device_name}"
        self._snapshots: dict[bool, pb.ListAndWatchResponse] = {}
        # The answer is the same for every allocation: built once, serialised per call.
        self._answers: dict[int, pb.AllocateResponse] = {}
        self._max_allocate_bytes = max_allocate_bytes(self._ids)
        self._allocating: set[asyncio.Task[object]] = set()

    def add_to_server(self, server: grpc.aio.Server, tag: int = 0) -> None:
        """The generated registration, except that Allocate and GetPreferredAllocation read
        their requests through a size check: megabytes the kubelet would never send are
        refused unparsed, and parsing them would hold the event loop. Streams are counted under
        `tag`: the registrar tells the streams of its current server from older ones."""
        limit = self._max_allocate_bytes
        handlers = {
            "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
                self.GetDevicePluginOptions,
                request_deserializer=pb.Empty.FromString,
                response_serializer=pb.DevicePluginOptions.SerializeToString,
            ),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                functools.partial(self.ListAndWatch, server_tag=tag),
                request_deserializer=pb.Empty.FromString,
                response_serializer=pb.ListAndWatchResponse.SerializeToString,
            ),
            "GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(
                self.GetPreferredAllocation,
                # available and must-include IDs: each at most the node's, so twice the bound
                request_deserializer=reader(
                    pb.PreferredAllocationRequest.FromString, 2 * limit, "request"
                ),
                response_serializer=pb.PreferredAllocationResponse.SerializeToString,
            ),
            "Allocate": grpc.unary_unary_rpc_method_handler(
                self.Allocate,
                request_deserializer=reader(pb.AllocateRequest.FromString, limit, "request"),
                response_serializer=pb.AllocateResponse.SerializeToString,
            ),
            "PreStartContainer": grpc.unary_unary_rpc_method_handler(
                self.PreStartContainer,
                request_deserializer=pb.PreStartContainerRequest.FromString,
                response_serializer=pb.PreStartContainerResponse.SerializeToString,
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))

    def _snapshot(self) -> pb.ListAndWatchResponse:
        # Built once per health state and shared by every stream: 100 streams of 2000 devices
        # must not build 200,000 messages on the event loop at each transition.
        healthy = self._health.healthy
        cached = self._snapshots.get(healthy)
        if cached is None:
            state = HEALTHY if healthy else UNHEALTHY
            cached = pb.ListAndWatchResponse(
                devices=[pb.Device(ID=i, health=state) for i in self._ids]
            )
            self._snapshots[healthy] = cached
        return cached

    async def _answers_first(self) -> None:
        """Let the Allocates in flight when health changed be answered before the streams hear.

        The kubelet admits a pod only once Allocate answers, while a stream update is a
        notification. Both wait on the same device check, and a stream's write of a large
        device list holds the event loop for about a millisecond per stream (grpc.aio's send
        path): told first, the streams would delay every refusal by that much."""
        pending = {t for t in self._allocating if not t.done()}
        if pending:
            await asyncio.wait(pending, timeout=ANSWERS_FIRST_S)

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext[pb.Empty, pb.DevicePluginOptions]
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    async def ListAndWatch(
        self,
        request: pb.Empty,
        context: grpc.aio.ServicerContext[pb.Empty, pb.ListAndWatchResponse],
        server_tag: int = 0,
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        self._health.stream_opened(server_tag)
        log("stream_opened", streams=self._health.streams)
        try:
            seen = self._health.generation
            yield self._snapshot()
            while not self._health.shutting_down:
                seen = await self._health.wait_change(seen)
                await self._answers_first()
                if self._health.shutting_down:
                    # An empty list drops the resource at once instead of after the grace period.
                    yield pb.ListAndWatchResponse(devices=[])
                    return
                yield self._snapshot()
        finally:
            self._health.stream_closed(server_tag)
            log("stream_closed", streams=self._health.streams)

    async def GetPreferredAllocation(
        self,
        request: pb.PreferredAllocationRequest | Unread,
        context: grpc.aio.ServicerContext[
            pb.PreferredAllocationRequest, pb.PreferredAllocationResponse
        ],
    ) -> pb.PreferredAllocationResponse:
        invalid = preferred_problem(request, self._limit)
        if invalid or isinstance(request, Unread):
            warn("preferred_allocation_refused", code="INVALID_ARGUMENT", reason=invalid)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, invalid)
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(
                    deviceIDs=preferred(
                        r.available_deviceIDs, r.must_include_deviceIDs, r.allocation_size
                    )
                )
                for r in request.container_requests
            ]
        )

    async def PreStartContainer(
        self,
        request: pb.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[
            pb.PreStartContainerRequest, pb.PreStartContainerResponse
        ],
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()

    def _container_response(self) -> pb.ContainerAllocateResponse:
        device = self._cfg.hypervisor_device
        if self._cfg.mode == "device-access":
            # "m" (mknod) is never granted: the pod gets read/write on the one node only.
            return pb.ContainerAllocateResponse(
                devices=[pb.DeviceSpec(container_path=device, host_path=device, permissions="rw")]
            )
        return pb.ContainerAllocateResponse(
            cdi_devices=[pb.CDIDevice(name=self._cdi_name)],
            envs={"HYPERLIGHT_HYPERVISOR": self._cfg.device_name, "HYPERLIGHT_DEVICE_PATH": device},
        )

    async def Allocate(
        self,
        request: pb.AllocateRequest | Unread,
        context: grpc.aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse],
    ) -> pb.AllocateResponse:
        invalid = allocate_problem(request, self._known, self._limit)
        if invalid or isinstance(request, Unread):
            metrics.ALLOCATIONS.labels(result="invalid_argument").inc()
            warn("allocate_refused", code="INVALID_ARGUMENT", reason=invalid)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, invalid)
        # Re-verify on every allocation: the spec (repaired now if needed) and the device.
        task = asyncio.current_task()
        if task is not None:  # the RPC's own task, done once its answer is sent
            self._allocating.add(task)
            task.add_done_callback(self._allocating.discard)
        await self._monitor.verify_for_allocate()
        reasons = self._health.readiness_reasons()
        if reasons:
            message = "not ready: " + "; ".join(reasons)
            metrics.ALLOCATIONS.labels(result="unavailable").inc()
            warn("allocate_refused", code="UNAVAILABLE", reason=message)
            await context.abort(grpc.StatusCode.UNAVAILABLE, message)
        metrics.ALLOCATIONS.labels(result="ok").inc()
        count = len(request.container_requests)
        # Successes at debug: the kubelet logs every admission, and a JSON line per Allocate is
        # measurable at high rates; refusals stay warnings. Bounded: the first IDs and a count.
        ids = itertools.chain.from_iterable(c.devices_ids for c in request.container_requests)
        total = sum(len(c.devices_ids) for c in request.container_requests)
        log("allocated", logging.DEBUG, containers=count, devices=show_ids(ids, total))
        answer = self._answers.get(count)
        if answer is None:
            answer = pb.AllocateResponse(
                container_responses=[self._container_response() for _ in range(count)]
            )
            if count <= 8:  # kubelet sends one; never let a caller grow this cache unboundedly
                self._answers[count] = answer
        return answer
