"""ListAndWatch streams held by the harness (grpc.aio, one event loop), each snapshot stamped."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api import deviceplugin_pb2_grpc as pb_grpc
from hv_device_plugin.api.wire import HEALTHY
from hvconform.bench.waits import BenchTimeout, within

CONNECT_S = 10.0


@dataclass(frozen=True)
class Snapshot:
    t: float  # time.monotonic() when the harness got it
    healthy: bool


class Stream:
    """One ListAndWatch stream on its own channel (its own connection, like another client)."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.channel = grpc.aio.insecure_channel(f"unix:{socket}")
        self.snapshots: list[Snapshot] = []
        self.error = ""
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        await within(self.channel.channel_ready(), CONNECT_S, f"a channel to {self.socket}")
        self._task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        call = pb_grpc.DevicePluginStub(self.channel).ListAndWatch(pb.Empty())
        try:
            async for response in call:
                stamp = time.monotonic()
                devices = response.devices
                # The plugin gives every device one health: the ends stand for all 2000, and
                # reading only them keeps the harness's own cost out of the measurement.
                healthy = bool(devices) and (
                    devices[0].health == HEALTHY and devices[-1].health == HEALTHY
                )
                self.snapshots.append(Snapshot(stamp, healthy))
                old, self._changed = self._changed, asyncio.Event()
                old.set()
        except grpc.aio.AioRpcError as exc:
            self.error = f"{exc.code().name}: {exc.details()}"
        finally:
            old, self._changed = self._changed, asyncio.Event()
            old.set()

    def latest(self) -> bool | None:
        return self.snapshots[-1].healthy if self.snapshots else None

    def first(self, healthy: bool, after: float) -> Snapshot | None:
        return next((s for s in self.snapshots if s.t >= after and s.healthy == healthy), None)

    async def wait(self, healthy: bool, after: float, seconds: float, what: str) -> float:
        """Stamp of the first snapshot at or after `after` with this health."""
        end = time.monotonic() + seconds
        while True:
            found = self.first(healthy, after)
            if found is not None:
                return found.t
            if self._task is None or self._task.done():
                raise RuntimeError(f"stream ended while waiting for {what}: {self.error}")
            left = end - time.monotonic()
            if left <= 0:
                raise BenchTimeout(what, seconds, self.latest())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._changed.wait()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.channel.close(None)


async def open_streams(socket: Path, count: int) -> list[Stream]:
    """`count` streams, each with a first Healthy snapshot in hand."""
    streams = [Stream(socket) for _ in range(count)]
    try:
        for s in streams:
            await s.open()
        for i, s in enumerate(streams):
            await s.wait(True, 0.0, CONNECT_S, f"the first Healthy snapshot on stream {i}")
    except BaseException:
        await close_streams(streams)
        raise
    return streams


async def close_streams(streams: list[Stream]) -> None:
    for s in streams:
        await s.close()
