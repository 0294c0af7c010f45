"""The floor: `python -m hvconform.bench.floor SOCKET [--slots N]`, a plugin that does nothing.

A grpc.aio server with the plugin's Allocate and ListAndWatch wire shapes and no plugin work:
Allocate answers a constant at once; ListAndWatch streams one snapshot built once per change and
shared by every stream, and SIGUSR1 flips its health. The same load against it shows what this
machine, grpc.aio and the clients cost by themselves; its idle threads show what grpc alone wakes
for. Runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator

import grpc

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api.wire import HEALTHY, UNHEALTHY

SERVICE = "v1beta1.DevicePlugin"
DRAIN_S = 2.0
# The shape of the plugin's answer, so both serialise the same bytes.
ANSWER = pb.AllocateResponse(
    container_responses=[
        pb.ContainerAllocateResponse(
            cdi_devices=[pb.CDIDevice(name="hyperlight.dev/hypervisor=kvm")],
            envs={"HYPERLIGHT_HYPERVISOR": "kvm", "HYPERLIGHT_DEVICE_PATH": "/dev/kvm"},
        )
    ]
)


class Floor:
    """Shared health and one shared snapshot per health change."""

    def __init__(self, slots: int) -> None:
        self._ids = [f"kvm-{i}" for i in range(slots)]
        self.healthy = True
        self.snapshot = self._build()
        self._changed = asyncio.Event()
        self.streams = 0
        self.no_streams = asyncio.Event()
        self.no_streams.set()

    def _build(self) -> pb.ListAndWatchResponse:
        state = HEALTHY if self.healthy else UNHEALTHY
        return pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health=state) for i in self._ids])

    def flip(self) -> None:
        self.healthy = not self.healthy
        self.snapshot = self._build()
        old, self._changed = self._changed, asyncio.Event()
        old.set()

    async def allocate(
        self,
        request: pb.AllocateRequest,
        context: grpc.aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse],
    ) -> pb.AllocateResponse:
        return ANSWER

    async def list_and_watch(
        self,
        request: pb.Empty,
        context: grpc.aio.ServicerContext[pb.Empty, pb.ListAndWatchResponse],
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        self.streams += 1
        self.no_streams.clear()
        try:
            while True:
                # Take the event before yielding: a flip during the send still wakes it.
                changed = self._changed
                yield self.snapshot
                await changed.wait()
        finally:
            self.streams -= 1
            if self.streams == 0:
                self.no_streams.set()


async def serve(socket: str, slots: int) -> None:
    floor = Floor(slots)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, floor.flip)
    server = grpc.aio.server()
    # Registered the way the generated code registers the plugin's methods.
    methods = {
        "Allocate": grpc.unary_unary_rpc_method_handler(
            floor.allocate,
            request_deserializer=pb.AllocateRequest.FromString,
            response_serializer=pb.AllocateResponse.SerializeToString,
        ),
        "ListAndWatch": grpc.unary_stream_rpc_method_handler(
            floor.list_and_watch,
            request_deserializer=pb.Empty.FromString,
            response_serializer=pb.ListAndWatchResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    server.add_insecure_port(f"unix:{socket}")
    await server.start()
    await stop.wait()
    # The harness closes its streams before SIGTERM, but their ends may still be on the way:
    # stopping with handlers pending makes grpc print a CancelledError for each.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(DRAIN_S):
            await floor.no_streams.wait()
    await server.stop(None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hvconform.bench.floor", description=__doc__)
    parser.add_argument("socket")
    parser.add_argument("--slots", type=int, default=2000)
    ns = parser.parse_args(argv)
    asyncio.run(serve(ns.socket, ns.slots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
