"""Re-registration after kubelet restarts, and health propagation to open streams."""

from __future__ import annotations

import asyncio
import functools
import os
import random
import signal
import time
from collections.abc import Callable

from hvconform.bench.figures_host import RssSampler
from hvconform.bench.harness import Bench, floor_server
from hvconform.bench.procfs import Span
from hvconform.bench.report import SEED_REREGISTRATION_S, Figure, Target, figure
from hvconform.bench.streams import Stream, close_streams, open_streams
from hvconform.bench.waits import Plan, poll_until, within
from hvconform.kubelet import RegistrationRecord

REREGISTER_S = 30.0
PROPAGATE_S = 10.0


def _pause(plan: Plan) -> float:
    return random.uniform(*plan.gap_s)  # noqa: S311 - jitter, not crypto


def _first_ok_after(bench: Bench, started: float) -> RegistrationRecord | None:
    ok = bench.kubelet.registrations(bench.resource)
    return next((r for r in ok if r.ok and r.t > started), None)


async def reregistration(bench: Bench, plan: Plan) -> list[Figure]:
    """Graceful and crash restarts of the emulator: restart done -> successful Register."""
    figures: list[Figure] = []
    for graceful in (True, False):
        label = "graceful" if graceful else "crash"
        span = Span()
        registered: list[float] = []
        allocatable: list[float] = []
        for i in range(plan.warmup + plan.restarts):
            what = f"{label} kubelet restart {i}"
            await asyncio.to_thread(bench.kubelet.restart, graceful, REREGISTER_S)
            started = bench.kubelet.emulator.started_at
            assert started is not None
            rec = await poll_until(
                functools.partial(_first_ok_after, bench, started),
                REREGISTER_S,
                f"a Register after {what}",
            )
            await poll_until(
                bench.all_allocatable, REREGISTER_S, f"every slot allocatable after {what}"
            )
            back = time.monotonic()
            await asyncio.sleep(_pause(plan))
            if i >= plan.warmup:
                registered.append(rec.t - started)
                allocatable.append(back - started)
        load = span.load()
        how = (
            "stop removing kubelet.sock, then start"
            if graceful
            else "stop as a crash (kubelet.sock left behind; start-up cleanup removes every "
            "socket), then start"
        )
        warm = f"{plan.warmup} warm-up restarts dropped"
        figures.append(
            figure(
                f"reregister.{label}",
                f"Re-registration after a {label} kubelet restart",
                f"Kubelet emulator restart ({how}); from the moment the new kubelet.sock "
                "listens (the emulator's start stamp) to the emulator's record of the next "
                f"successful Register (after its dial and GetDevicePluginOptions); {warm}.",
                "ms",
                registered,
                scale=1000.0,
                seed=SEED_REREGISTRATION_S * 1000.0,
                seed_text="5.01 s (real kubelet)",
                targets=[Target("median", 250.0)],
                load=load,
            )
        )
        figures.append(
            figure(
                f"reregister.{label}.allocatable",
                f"{label.capitalize()} kubelet restart -> every slot allocatable",
                "Same restarts; to the harness seeing the emulator count every slot allocatable "
                "again (new ListAndWatch stream, first snapshot applied; 1 ms polling).",
                "ms",
                allocatable,
                scale=1000.0,
                load=load,
            )
        )
    return figures


async def _flip(
    streams: list[Stream], fault: Callable[[], None], heal: Callable[[], None], what: str
) -> tuple[float, float]:
    """One sample: fault -> Unhealthy on every stream, heal -> Healthy on every stream; the
    time until the LAST stream got each."""
    t0 = time.monotonic()
    fault()
    downs = await within(
        asyncio.gather(*(s.wait(False, t0, PROPAGATE_S, f"Unhealthy, {what}") for s in streams)),
        PROPAGATE_S,
        f"Unhealthy on all streams, {what}",
    )
    t1 = time.monotonic()
    heal()
    ups = await within(
        asyncio.gather(*(s.wait(True, t1, PROPAGATE_S, f"Healthy, {what}") for s in streams)),
        PROPAGATE_S,
        f"Healthy on all streams, {what}",
    )
    return max(downs) - t0, max(ups) - t1


async def health_propagation(bench: Bench, plan: Plan, rss: RssSampler) -> list[Figure]:
    """Device removed from the host view -> Unhealthy on every open stream (1, 10, 100); each
    sample followed by the same broadcast from the floor, so both see the same machine load."""
    figures: list[Figure] = []
    async with floor_server(bench) as (floor_sock, floor_pid):

        def flip_floor() -> None:
            os.kill(floor_pid, signal.SIGUSR1)

        for count in plan.stream_counts:
            span = Span()
            down: list[float] = []
            up: list[float] = []
            base: list[float] = []
            streams = await open_streams(bench.socket(), count)
            floors: list[Stream] = []
            try:
                floors = await open_streams(floor_sock, count)
                async with rss.sampling(f"{count} streams"):
                    for i in range(plan.warmup + plan.health_samples):
                        what = f"sample {i} with {count} streams"
                        d, u = await _flip(streams, bench.remove_device, bench.restore_device, what)
                        await asyncio.sleep(_pause(plan))
                        f, _ = await _flip(floors, flip_floor, flip_floor, f"floor {what}")
                        await asyncio.sleep(_pause(plan))
                        if i >= plan.warmup:
                            down, up, base = [*down, d], [*up, u], [*base, f]
            finally:
                await close_streams(streams + floors)
                if not bench.device_present():  # a failed sample must not leave it removed
                    bench.restore_device()
            figures += _health_figures(plan, count, down, up, base, span.load())
    return figures


def _health_figures(
    plan: Plan,
    count: int,
    down: list[float],
    up: list[float],
    base: list[float],
    load: dict[str, float],
) -> list[Figure]:
    streams = (
        f"{count} ListAndWatch stream(s), each on its own channel, read by grpc.aio in one "
        f"harness event loop; {plan.warmup} warm-up samples dropped"
    )
    figures = [
        figure(
            f"health.unhealthy.{count}",
            f"Device removed -> Unhealthy on all {count} stream(s)",
            f"{streams}; from just before unlinking the host view's kvm node to the last "
            "stream's receipt of an Unhealthy snapshot (2000 devices).",
            "ms",
            down,
            scale=1000.0,
            targets=[Target("median", 100.0)] if count >= 100 else [],
            load=load,
        ),
        figure(
            f"health.healthy.{count}",
            f"Device restored -> Healthy on all {count} stream(s)",
            f"{streams}; from just before the mknod that restores the kvm node to the last "
            "stream's receipt of a Healthy snapshot.",
            "ms",
            up,
            scale=1000.0,
            load=load,
        ),
        figure(
            f"health.floor.{count}",
            f"Floor: shared snapshot -> all {count} stream(s)",
            f"{streams}, on the floor server (hvconform.bench.floor), right after each plugin "
            "sample; from just before SIGUSR1 (flip health, build ONE snapshot shared by every "
            "stream) to the last stream's receipt of it: the broadcast cost of grpc.aio, the "
            "harness and this machine alone.",
            "ms",
            base,
            scale=1000.0,
            load=load,
        ),
    ]
    plugin, floor = figures[0], figures[2]
    if plugin.median is not None and floor.median is not None:
        plugin.notes.append(
            f"above the floor's shared-snapshot broadcast, measured alongside: median "
            f"+{plugin.median - floor.median:.1f} ms (the plugin's own share: the device check "
            "and a snapshot per stream)"
        )
    return figures
