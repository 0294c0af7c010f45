"""Start-up (plugin restart: exec -> registered and ready) and refusal on an unusable device.

Start-up: the plugin is stopped with SIGTERM and started again from its profile, in the same
sandbox; the clock starts at the exec (the launcher's close-on-exec handshake ends there), so the
launcher's own namespace set-up is nobody's figure. Refusal: /dev/null's node is renamed onto the
hypervisor path (and into the host view, identity made to match) and an Allocate is sent at once
on a warm channel; the answer must be a refusal, and a ListAndWatch stream must go Unhealthy on
the same event.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time

import grpc

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api import deviceplugin_pb2_grpc as pb_grpc
from hvconform.bench.harness import Bench
from hvconform.bench.procfs import Span
from hvconform.bench.report import Figure, Target, figure
from hvconform.bench.streams import close_streams, open_streams
from hvconform.bench.waits import Plan, poll_until, within
from hvconform.kubelet import RegistrationRecord

START_S = 30.0
REFUSE_S = 10.0
READY_POLL_S = 0.002


def _first_ok_after(bench: Bench, started: float) -> RegistrationRecord | None:
    records = bench.kubelet.registrations(bench.resource)
    return next((r for r in records if r.ok and r.t > started), None)


async def startup(bench: Bench, plan: Plan) -> list[Figure]:
    """Plugin restarts: exec -> first Register, and exec -> registered, allocatable and ready."""
    span = Span()
    registered: list[float] = []
    ready: list[float] = []
    for i in range(plan.warmup + plan.plugin_restarts):
        what = f"plugin restart {i}"
        exec_at = await asyncio.to_thread(bench.restart)
        rec = await poll_until(
            functools.partial(_first_ok_after, bench, exec_at), START_S, f"a Register, {what}"
        )
        await poll_until(bench.all_allocatable, START_S, f"every slot allocatable, {what}")
        # Probed only once the kubelet's view is complete: polling earlier would take CPU from
        # the start-up it measures.
        await poll_until(bench.ready, START_S, f"ready, {what}", interval=READY_POLL_S)
        back = time.monotonic()
        await asyncio.sleep(random.uniform(*plan.gap_s))  # noqa: S311 - jitter, not crypto
        if i >= plan.warmup:
            registered.append(rec.t - exec_at)
            ready.append(back - exec_at)
    load = span.load()
    how = (
        "SIGTERM, exit awaited, then the same profile command started again in the same "
        "sandbox; from the exec (the launcher's close-on-exec handshake) to"
    )
    probe = bench.plugin.readiness
    seen = f"its readiness probe ({probe.type}) passing" if probe.observable else "(no probe)"
    warm = f"{plan.warmup} warm-up restarts dropped"
    return [
        figure(
            "start.registered",
            "Plugin start: exec -> registered",
            f"{how} the emulator's record of its first successful Register; {warm}.",
            "ms",
            registered,
            scale=1000.0,
            load=load,
        ),
        figure(
            "start.ready",
            "Plugin start: exec -> registered and ready",
            f"{how} registered, every slot allocatable in the emulator and {seen} "
            f"(probed every {READY_POLL_S * 1000:g} ms once allocatable); {warm}.",
            "ms",
            ready,
            scale=1000.0,
            targets=[Target("median", 100.0)],
            load=load,
        ),
    ]


async def refusal(bench: Bench, plan: Plan) -> list[Figure]:
    """Unusable device -> Allocate refused, stream Unhealthy; restored -> Allocate granted."""
    span = Span()
    refused: list[float] = []
    unhealthy: list[float] = []
    granted: list[float] = []
    wrongly_granted = 0
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=bench.device_ids[:1])]
    )
    (stream,) = await open_streams(bench.socket(), 1)
    channel = grpc.aio.insecure_channel(f"unix:{bench.socket()}")
    try:
        await within(channel.channel_ready(), REFUSE_S, "a channel to the plugin")
        stub = pb_grpc.DevicePluginStub(channel)
        await stub.Allocate(request, timeout=REFUSE_S)  # a warm channel and handler
        for i in range(plan.warmup + plan.refusals):
            what = f"refusal sample {i}"
            t0 = time.monotonic()
            bench.make_unusable(True)
            try:
                await stub.Allocate(request, timeout=REFUSE_S)
                wrongly_granted += 1
            except grpc.aio.AioRpcError:
                pass
            t1 = time.monotonic()
            down = await stream.wait(False, t0, REFUSE_S, f"Unhealthy, {what}")
            t2 = time.monotonic()
            bench.make_unusable(False)
            await stream.wait(True, t2, REFUSE_S, f"Healthy again, {what}")
            t3 = time.monotonic()
            await within(stub.Allocate(request, timeout=REFUSE_S), REFUSE_S, f"Allocate, {what}")
            t4 = time.monotonic()
            await asyncio.sleep(random.uniform(*plan.gap_s))  # noqa: S311 - jitter, not crypto
            if i >= plan.warmup:
                refused.append(t1 - t0)
                unhealthy.append(down - t0)
                granted.append(t4 - t3)
    finally:
        if not bench.device_usable():
            bench.make_unusable(False)  # a failed sample must not leave the device unusable
        await channel.close(None)
        await close_streams([stream])
    return _refusal_figures(plan, refused, unhealthy, granted, wrongly_granted, span.load())


def _refusal_figures(
    plan: Plan,
    refused: list[float],
    unhealthy: list[float],
    granted: list[float],
    wrongly_granted: int,
    load: dict[str, float],
) -> list[Figure]:
    how = (
        "/dev/null's node (1:3) renamed onto the plugin's /dev/kvm (and onto its host-device "
        "view's kvm, if it reads one, so identity matches and only usability fails), on a warm "
        f"grpc.aio channel; {plan.warmup} warm-up samples dropped"
    )
    figures = [
        figure(
            "refusal.allocate",
            "Unusable device -> Allocate refused",
            f"{how}; from just before the first rename to the refusal's arrival (the Allocate "
            "is sent right after the renames).",
            "ms",
            refused,
            scale=1000.0,
            targets=[Target("median", 5.0)],
            load=load,
        ),
        figure(
            "refusal.unhealthy",
            "Unusable device -> Unhealthy on a stream",
            f"{how}; from just before the first rename to an Unhealthy snapshot on a "
            "ListAndWatch stream the harness holds (the same event as the refusal).",
            "ms",
            unhealthy,
            scale=1000.0,
            load=load,
        ),
        figure(
            "refusal.granted",
            "Device restored -> Allocate granted",
            "Same samples: once the real node is back and the stream Healthy again, one "
            "Allocate on the same channel, timed from send to answer (a successful Allocate "
            "right after a device event: its own probe).",
            "ms",
            granted,
            scale=1000.0,
            load=load,
        ),
    ]
    wrong = figure(
        "refusal.wrongly_granted",
        "Allocates granted on an unusable device",
        f"{how}; count of Allocates answered OK (samples = Allocates sent).",
        "answers",
        [float(wrongly_granted)],
        targets=[Target("max", 0.0, "<=")],
        load=load,
    )
    wrong.samples = plan.warmup + plan.refusals
    return [*figures, wrong]
