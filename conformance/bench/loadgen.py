"""Allocate load generator: `python -m hvconform.bench.loadgen SOCKET --concurrency C ...`.

A separate process on purpose: the harness's own GIL (kubelet emulator thread, event loop) must
not be part of the measured latency. One grpc.aio channel, as the kubelet holds one connection;
C coroutines each send one Allocate (one container, one device ID) after the other. Writes the
per-request latencies and completion times (seconds, time.perf_counter) as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from pathlib import Path

import grpc

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api import deviceplugin_pb2_grpc as pb_grpc

CONNECT_S = 10.0
CALL_S = 10.0


def _request(i: int, ids: list[str]) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=[ids[i % len(ids)]])]
    )


async def run(
    socket: str,
    concurrency: int,
    requests: int,
    warmup: int,
    ids: list[str],
    interval: float = 0.0,
) -> dict[str, object]:
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        try:
            async with asyncio.timeout(CONNECT_S):
                await channel.channel_ready()
        except TimeoutError:
            raise SystemExit(
                f"loadgen: connecting to {socket} expired after {CONNECT_S} s"
            ) from None
        stub = pb_grpc.DevicePluginStub(channel)
        for i in range(warmup):  # warm the channel, the plugin's handlers and the probe helper
            await stub.Allocate(_request(i, ids), timeout=CALL_S)
        latencies: list[float] = []
        finished: list[float] = []
        errors: list[str] = []
        counter = itertools.count()
        started = time.perf_counter()

        async def worker() -> None:
            while (i := next(counter)) < requests:
                t0 = time.perf_counter()
                try:
                    await stub.Allocate(_request(i, ids), timeout=CALL_S)
                except grpc.aio.AioRpcError as exc:
                    errors.append(f"{exc.code().name}: {exc.details()}")
                    continue
                t1 = time.perf_counter()
                latencies.append(t1 - t0)
                finished.append(t1 - started)
                if interval:  # pacing, not synchronisation: the kubelet's admissions are apart
                    await asyncio.sleep(interval)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return {
        "concurrency": concurrency,
        "requests": requests,
        "wall_s": wall,
        "latencies_s": latencies,
        "finished_s": finished,
        "errors": len(errors),
        "error_samples": errors[:5],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hvconform.bench.loadgen", description=__doc__)
    parser.add_argument("socket")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--slots", type=int, default=2000, help="IDs kvm-0 .. kvm-(N-1)")
    parser.add_argument("--ids", default="", help="comma-separated device IDs (replaces --slots)")
    parser.add_argument(
        "--interval", type=float, default=0.0, help="seconds each worker waits between calls"
    )
    parser.add_argument("--out", required=True)
    ns = parser.parse_args(argv)
    ids = ns.ids.split(",") if ns.ids else [f"kvm-{i}" for i in range(ns.slots)]
    result = asyncio.run(run(ns.socket, ns.concurrency, ns.requests, ns.warmup, ids, ns.interval))
    tmp = Path(ns.out + ".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(ns.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
