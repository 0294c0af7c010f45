"""The kubelet's client of one registered device plugin (one endpoint per Register).

Dial, options, the ListAndWatch consumer and the allocation RPCs, each failing with the
error text the kubelet would produce.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import grpc

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api import deviceplugin_pb2_grpc as pb_grpc

from .accounting import PluginOptions
from .validation import rpc_error_text

# Go's context.DeadlineExceeded / Canceled texts, as they appear in kubelet errors.
DEADLINE_EXCEEDED = "context deadline exceeded"
CANCELED = "context canceled"
STREAM_EOF = "EOF"


class EndpointError(Exception):
    """A call to the plugin failed; str() is the kubelet's error text."""


SnapshotCallback = Callable[["PluginEndpoint", pb.ListAndWatchResponse], None]
EndCallback = Callable[["PluginEndpoint", str], None]


class PluginEndpoint:
    """One plugin connection as the kubelet holds it."""

    def __init__(self, resource: str, socket_path: str) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self.options: PluginOptions | None = None
        self.stopped = False  # kubelet considers it disconnected (stream ended)
        self.closing = False  # the kubelet itself is tearing it down
        self.stream_error: str | None = None
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.DevicePluginAsyncStub | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def stopped_placeholder(cls, resource: str) -> PluginEndpoint:
        """A checkpointed resource after a kubelet start: known, but no plugin yet."""
        ep = cls(resource, "")
        ep.stopped = True
        return ep

    def __repr__(self) -> str:
        return f"&{{{self.resource} {self.socket_path}}}"

    def _require_stub(self) -> pb_grpc.DevicePluginAsyncStub:
        if self._stub is None or self.stopped:
            # errEndpointStopped = "endpoint %v has been stopped"
            raise EndpointError(f"endpoint {self!r} has been stopped")
        return self._stub

    async def connect(self, timeout_s: float) -> None:
        """Blocking dial with a deadline, like grpc.DialContext(..., WithBlock())."""
        channel = grpc.aio.insecure_channel(f"unix:{self.socket_path}")
        try:
            async with asyncio.timeout(timeout_s):
                await channel.channel_ready()
        except TimeoutError:
            await channel.close(None)
            raise EndpointError(f"failed to dial device plugin: {DEADLINE_EXCEEDED}") from None
        except BaseException:
            await channel.close(None)
            raise
        self._channel = channel
        self._stub = pb_grpc.DevicePluginStub(channel)

    async def fetch_options(self) -> PluginOptions:
        """GetDevicePluginOptions; its answer (not RegisterRequest.options) is what counts."""
        stub = self._require_stub()
        try:
            answer = await stub.GetDevicePluginOptions(pb.Empty())
        except grpc.aio.AioRpcError as err:
            text = rpc_error_text(err)
            raise EndpointError(f"failed to get device plugin options: {text}") from err
        self.options = PluginOptions.from_pb(answer)
        return self.options

    def start_stream(self, on_snapshot: SnapshotCallback, on_end: EndCallback) -> None:
        """Consume ListAndWatch in a task; on_end runs exactly once with the end reason."""
        self._task = asyncio.get_running_loop().create_task(
            self._consume(on_snapshot, on_end), name=f"list-and-watch {self.resource}"
        )

    async def _consume(self, on_snapshot: SnapshotCallback, on_end: EndCallback) -> None:
        reason = STREAM_EOF
        try:
            call = self._require_stub().ListAndWatch(pb.Empty())
            async for response in call:
                if self.closing:
                    break
                on_snapshot(self, response)
        except grpc.aio.AioRpcError as err:
            reason = rpc_error_text(err)
        except EndpointError as err:
            reason = str(err)
        except asyncio.CancelledError:
            reason = CANCELED
            raise
        finally:
            self.stream_error = reason
            on_end(self, reason)

    async def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """GetPreferredAllocation with one container request; [] when no answer."""
        stub = self._require_stub()
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        try:
            answer = await stub.GetPreferredAllocation(request)
        except grpc.aio.AioRpcError as err:
            raise EndpointError(rpc_error_text(err)) from err
        if not answer.container_responses:
            return []
        return list(answer.container_responses[0].deviceIDs)

    async def allocate(
        self, device_ids: Sequence[str], timeout_s: float | None = None
    ) -> pb.AllocateResponse:
        """Allocate with ONE ContainerAllocateRequest (the kubelet sets no deadline)."""
        stub = self._require_stub()
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=list(device_ids))]
        )
        try:
            return await stub.Allocate(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise EndpointError(rpc_error_text(err)) from err

    async def pre_start(self, device_ids: Sequence[str], timeout_s: float) -> None:
        """PreStartContainer with the kubelet's 30 s deadline."""
        stub = self._require_stub()
        request = pb.PreStartContainerRequest(devices_ids=list(device_ids))
        try:
            await stub.PreStartContainer(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise EndpointError(rpc_error_text(err)) from err

    async def end_stream(self) -> None:
        """The stream ends on the kubelet's side while the kubelet runs on: the consumer's end
        callback runs as for any stream end (closing stays False: not the kubelet's teardown)."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])

    async def close(self) -> None:
        """Tear down as the kubelet: end the stream, close the connection, wait for the task."""
        self.closing = True
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            # asyncio.wait neither raises the task's CancelledError nor swallows our own.
            await asyncio.wait([task])
        await self.close_channel()

    async def close_channel(self) -> None:
        """Close the gRPC connection only (Disconnect in the kubelet)."""
        channel, self._channel = self._channel, None
        self._stub = None
        if channel is not None:
            await channel.close(None)
