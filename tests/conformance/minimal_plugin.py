"""A minimal v1beta1 device plugin, written only to exercise the kubelet emulator.

In-process: `MinimalPlugin(...)` on the caller's event loop. As a subprocess:
`python minimal_plugin.py --plugin-dir D --resource R --count N [--watch]` serves, registers
and runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api import deviceplugin_pb2_grpc as pb_grpc

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass
class Faults:
    """Failure modes, each off by default."""

    fail_options: bool = False  # GetDevicePluginOptions aborts UNAVAILABLE "options broken"
    allocate_error: str | None = None  # Allocate aborts INTERNAL with this text
    allocate_empty: bool = False  # Allocate answers without container responses
    prestart_error: str | None = None  # PreStartContainer aborts INTERNAL with this text
    preferred: list[str] | None = None  # GetPreferredAllocation answer; None: first N available


@dataclass(frozen=True)
class _End:
    code: grpc.StatusCode | None
    details: str


class MinimalPlugin(pb_grpc.DevicePluginServicer):
    """Serves DevicePlugin on `<plugin_dir>/<socket_name>` and registers with the kubelet."""

    def __init__(
        self,
        plugin_dir: Path,
        resource_name: str = "example.com/dev",
        device_count: int = 2,
        *,
        socket_name: str = "minimal.sock",
        version: str = "v1beta1",
        options: pb.DevicePluginOptions | None = None,
        faults: Faults | None = None,
        watch_interval_s: float | None = None,
    ) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.resource_name = resource_name
        self.version = version
        self.options = options or pb.DevicePluginOptions()
        self.faults = faults or Faults()
        self.devices: dict[str, str] = {f"dev-{i}": HEALTHY for i in range(device_count)}
        self.allocate_requests: list[pb.AllocateRequest] = []
        self.preferred_requests: list[pb.PreferredAllocationRequest] = []
        self.prestart_requests: list[pb.PreStartContainerRequest] = []
        self.list_and_watch_calls = 0
        self.streams_ended = 0
        self.registrations = 0
        self._socket_base = socket_name.removesuffix(".sock")
        self.socket_name = socket_name
        self._serial = 0
        self._server: grpc.aio.Server | None = None
        self._inode: int | None = None
        self._streams: set[asyncio.Queue[pb.ListAndWatchResponse | _End]] = set()
        self._changed = asyncio.Event()
        self._watch_interval_s = watch_interval_s
        self._watcher: asyncio.Task[None] | None = None

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / self.socket_name

    @property
    def active_streams(self) -> int:
        return len(self._streams)

    # --- lifecycle ----------------------------------------------------------------------

    async def serve(self) -> None:
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(f"unix:{self.socket_path}")
        await server.start()
        self._server = server
        self._inode = self.socket_path.stat().st_ino

    async def register(self, timeout_s: float = 15.0) -> None:
        """Register with kubelet.sock; raises grpc.aio.AioRpcError on refusal."""
        async with grpc.aio.insecure_channel(f"unix:{self.plugin_dir / 'kubelet.sock'}") as ch:
            request = pb.RegisterRequest(
                version=self.version,
                endpoint=self.socket_name,
                resource_name=self.resource_name,
                options=self.options,
            )
            await pb_grpc.RegistrationStub(ch).Register(request, timeout=timeout_s)
        self.registrations += 1

    async def start(self) -> None:
        """Serve, then register (the order a plugin must use since kubelet 1.25)."""
        await self.serve()
        await self.register()
        if self._watch_interval_s is not None and self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def stop_serving(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(None)

    async def stop(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            await asyncio.wait([watcher])
        await self.stop_serving()

    async def restart_and_register(self, deadline_s: float = 10.0) -> None:
        """Fresh server on a fresh socket name, then register (retrying while refused)."""
        await self.stop_serving()
        self._serial += 1
        self.socket_name = f"{self._socket_base}-{self._serial}.sock"
        await self.serve()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + deadline_s
        while True:
            try:
                await self.register(timeout_s=max(0.1, deadline - loop.time()))
                return
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or loop.time() >= deadline:
                    raise
            await asyncio.sleep(0.05)  # kubelet.sock not accepting yet: the plugin's backoff

    async def _watch(self) -> None:
        """squat-style restart detection: lstat of our own socket at a fixed interval."""
        assert self._watch_interval_s is not None
        while True:
            await asyncio.sleep(self._watch_interval_s)
            try:
                present = self.socket_path.lstat().st_ino == self._inode
            except FileNotFoundError:
                present = False
            if not present:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await self.restart_and_register()

    # --- device state -------------------------------------------------------------------

    def set_health(self, device_id: str, healthy: bool) -> None:
        self.devices[device_id] = HEALTHY if healthy else UNHEALTHY
        self.push()

    def set_devices(self, devices: Mapping[str, str]) -> None:
        """Replace the device list with raw (id -> health string) pairs and push it."""
        self.devices = dict(devices)
        self.push()

    def push(self) -> None:
        for queue in self._streams:
            queue.put_nowait(self._snapshot())

    def push_raw(self, devices: list[tuple[str, str]]) -> None:
        """Send one snapshot exactly as given (duplicates allowed), bypassing self.devices."""
        snapshot = pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health=h) for i, h in devices])
        for queue in self._streams:
            queue.put_nowait(snapshot)

    def end_streams(self, code: grpc.StatusCode | None = None, details: str = "") -> None:
        """End every ListAndWatch stream: EOF when code is None, else with that status."""
        for queue in self._streams:
            queue.put_nowait(_End(code, details))

    def _snapshot(self) -> pb.ListAndWatchResponse:
        return pb.ListAndWatchResponse(
            devices=[pb.Device(ID=i, health=h) for i, h in self.devices.items()]
        )

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Wait for plugin-side state (stream counts) with a deadline."""
        try:
            async with asyncio.timeout(timeout_s):
                while not predicate():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise TimeoutError(
                f"plugin: timed out after {timeout_s} s waiting for {what}"
            ) from None

    # --- DevicePlugin service -------------------------------------------------------------

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext[pb.Empty, pb.DevicePluginOptions]
    ) -> pb.DevicePluginOptions:
        if self.faults.fail_options:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "options broken")
        return self.options

    async def ListAndWatch(
        self,
        request: pb.Empty,
        context: grpc.aio.ServicerContext[pb.Empty, pb.ListAndWatchResponse],
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        queue: asyncio.Queue[pb.ListAndWatchResponse | _End] = asyncio.Queue()
        self._streams.add(queue)
        self.list_and_watch_calls += 1
        self._changed.set()
        try:
            yield self._snapshot()
            while True:
                item = await queue.get()
                if isinstance(item, _End):
                    if item.code is not None:
                        await context.abort(item.code, item.details)
                    return
                yield item
        finally:
            self._streams.discard(queue)
            self.streams_ended += 1
            self._changed.set()

    async def GetPreferredAllocation(
        self,
        request: pb.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[
            pb.PreferredAllocationRequest, pb.PreferredAllocationResponse
        ],
    ) -> pb.PreferredAllocationResponse:
        self.preferred_requests.append(request)
        answers = []
        for creq in request.container_requests:
            ids = self.faults.preferred
            if ids is None:
                ids = list(creq.available_deviceIDs)[: creq.allocation_size]
            answers.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=answers)

    async def Allocate(
        self,
        request: pb.AllocateRequest,
        context: grpc.aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse],
    ) -> pb.AllocateResponse:
        self.allocate_requests.append(request)
        if self.faults.allocate_error is not None:
            await context.abort(grpc.StatusCode.INTERNAL, self.faults.allocate_error)
        if self.faults.allocate_empty:
            return pb.AllocateResponse()
        responses = []
        for creq in request.container_requests:
            ids = list(creq.devices_ids)
            responses.append(
                pb.ContainerAllocateResponse(
                    envs={"MINIMAL_DEVICES": ",".join(ids)},
                    devices=[
                        pb.DeviceSpec(
                            container_path="/dev/null", host_path="/dev/null", permissions="rw"
                        )
                    ],
                    cdi_devices=[pb.CDIDevice(name=f"{self.resource_name}={i}") for i in ids],
                )
            )
        return pb.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self,
        request: pb.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[
            pb.PreStartContainerRequest, pb.PreStartContainerResponse
        ],
    ) -> pb.PreStartContainerResponse:
        self.prestart_requests.append(request)
        if self.faults.prestart_error is not None:
            await context.abort(grpc.StatusCode.INTERNAL, self.faults.prestart_error)
        return pb.PreStartContainerResponse()


async def _main(args: argparse.Namespace) -> None:
    plugin = MinimalPlugin(
        Path(args.plugin_dir),
        args.resource,
        args.count,
        socket_name=args.socket_name,
        watch_interval_s=0.05 if args.watch else None,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await plugin.start()
    print(f"READY {plugin.socket_path} pid={os.getpid()}", flush=True)
    await stop.wait()
    await plugin.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--plugin-dir", required=True)
    parser.add_argument("--resource", default="example.com/dev")
    parser.add_argument("--count", type=int, default=2)
    parser.add_argument("--socket-name", default="minimal.sock")
    parser.add_argument("--watch", action="store_true", help="re-register when our socket goes")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
