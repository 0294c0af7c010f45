"""Allocate latency and allocations per second, from a load generator in a separate process.

The plugin and the floor (a do-nothing server with the same wire shapes) take turns in rounds,
so both see the same machine load: the floor tells how much of a figure is this machine,
grpc.aio and the client, and how much is the plugin's own work.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from hv_device_plugin.config import DEFAULT_PROBE_MAX_AGE_S
from hvconform.bench.figures_host import RssSampler
from hvconform.bench.harness import Bench, floor_server
from hvconform.bench.procfs import Span
from hvconform.bench.report import Figure, Target, figure
from hvconform.bench.waits import Plan, within

LOADGEN_S = 600.0
ROUNDS = 4  # plugin, floor, plugin, floor, ...: noise from other processes hits both alike


async def _load(
    bench: Bench,
    socket: Path,
    concurrency: int,
    requests: int,
    warmup: int,
    tag: str,
    interval: float = 0.0,
) -> dict[str, Any]:
    """One load generator run against `socket`; its JSON result."""
    out = bench.root / f"loadgen-{tag}-{concurrency}.json"
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "hvconform.bench.loadgen", str(socket)),
        *("--concurrency", str(concurrency), "--requests", str(requests)),
        *("--warmup", str(warmup), "--ids", ",".join(bench.device_ids), "--out", str(out)),
        *("--interval", str(interval)),
    )
    bench.track(proc.pid, f"loadgen {tag} c={concurrency}")
    try:
        code = await within(proc.wait(), LOADGEN_S, f"the load generator ({tag}, c={concurrency})")
    finally:
        if proc.returncode is None:
            proc.kill()
            await within(proc.wait(), 10.0, "the killed load generator to exit")
    if code != 0:
        raise RuntimeError(f"load generator {tag} c={concurrency} exited {code}")
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def _per_second(finished: list[float]) -> list[float]:
    """Completions per whole second of one run; a run shorter than 2 s gives its overall rate."""
    if not finished:
        return []
    whole = int(max(finished))
    if whole < 2:
        return [len(finished) / max(finished)]
    counts = [0] * whole
    for t in finished:
        if int(t) < whole:
            counts[int(t)] += 1
    return [float(c) for c in counts]


class _Runs:
    """Several load generator runs against one server, merged."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.rates: list[float] = []
        self.calls = 0
        self.wall = 0.0
        self.errors: list[str] = []

    def add(self, data: dict[str, Any]) -> None:
        self.latencies += data["latencies_s"]
        self.rates += _per_second(data["finished_s"])
        self.calls += len(data["latencies_s"])
        self.wall += data["wall_s"]
        if data["errors"]:
            self.errors.append(f"{data['errors']} failed: {data['error_samples']}")

    @property
    def overall(self) -> float:
        return self.calls / self.wall if self.wall else 0.0


async def allocate_load(bench: Bench, plan: Plan, rss: RssSampler) -> list[Figure]:
    """Per concurrency: latency, allocations per second, and the floor's latency."""
    figures: list[Figure] = []
    async with floor_server(bench) as (floor, _pid):
        for concurrency, requests in plan.alloc_requests:
            span = Span()
            plugin, base = _Runs(), _Runs()
            per_round = max(1, requests // ROUNDS)
            for r in range(ROUNDS):
                async with rss.sampling(f"Allocate c={concurrency}"):
                    plugin.add(
                        await _load(
                            bench,
                            bench.socket(),
                            concurrency,
                            per_round,
                            plan.alloc_warmup,
                            f"plugin-{r}",
                        )
                    )
                base.add(
                    await _load(
                        bench, floor, concurrency, per_round, plan.alloc_warmup, f"floor-{r}"
                    )
                )
            figures += _figures(plan, concurrency, per_round, plugin, base, span.load())
    figures.append(await _isolated(bench, plan))
    return figures


async def _isolated(bench: Bench, plan: Plan) -> Figure:
    """The kubelet's case: Allocates one at a time and apart, so each runs its own probe."""
    span = Span()
    runs = _Runs()
    runs.add(
        await _load(
            bench,
            bench.socket(),
            1,
            plan.alloc_isolated,
            0,
            "isolated",
            interval=plan.alloc_isolated_gap_s,
        )
    )
    return figure(
        "allocate.isolated.latency",
        "Allocate latency, isolated (each with its own device probe)",
        f"{plan.alloc_isolated} Allocate calls one at a time, {plan.alloc_isolated_gap_s * 1000:g} "
        f"ms apart (beyond the plugin's {DEFAULT_PROBE_MAX_AGE_S * 1000:g} ms --probe-max-age, as "
        "kubelet admissions are), from a "
        "separate process on one grpc.aio channel; each call timed from send to answer and "
        "answered only after its own KVM_CREATE_VM probe and a read of the CDI spec.",
        "ms",
        runs.latencies,
        scale=1000.0,
        load=span.load(),
        notes=list(runs.errors),
    )


def _figures(
    plan: Plan, concurrency: int, per_round: int, plugin: _Runs, base: _Runs, load: dict[str, float]
) -> list[Figure]:
    how = (
        f"{ROUNDS} rounds of {per_round} Allocate calls (one container, one device ID), each "
        f"after {plan.alloc_warmup} warm-up calls, {concurrency} in flight on one grpc.aio "
        "channel from a separate process, the plugin and the floor taking turns; each call "
        "timed from send to answer"
    )
    lat = figure(
        f"allocate.c{concurrency}.latency",
        f"Allocate latency, concurrency {concurrency}",
        f"{how} (every Allocate re-checks the device and the CDI spec). Median is p50.",
        "ms",
        plugin.latencies,
        scale=1000.0,
        targets=[Target("p99", 10.0)] if concurrency >= 16 else [],
        load=load,
        notes=list(plugin.errors),
    )
    rate = figure(
        f"allocate.c{concurrency}.rate",
        f"Allocations per second, concurrency {concurrency}",
        f"Same plugin runs; completed calls per whole second (overall {plugin.overall:.0f}/s; "
        f"the floor {base.overall:.0f}/s).",
        "allocations/s",
        plugin.rates,
        better="higher",
        load=load,
    )
    floor = figure(
        f"allocate.c{concurrency}.floor",
        f"Floor: no-op Allocate latency, concurrency {concurrency}",
        f"{how}; against the floor (hvconform.bench.floor: answers a constant at once): what "
        "this machine, grpc.aio and the client cost without any plugin work.",
        "ms",
        base.latencies,
        scale=1000.0,
        load=load,
        notes=[f"{base.overall:.0f} calls/s overall", *base.errors],
    )
    if lat.median is not None and floor.median is not None:
        assert lat.p99 is not None and floor.p99 is not None
        lat.notes.append(
            f"above the floor, measured alongside: median +{lat.median - floor.median:.2f} ms, "
            f"p99 +{lat.p99 - floor.p99:.2f} ms (the plugin's own share)"
        )
        for target in lat.targets:
            bound = getattr(floor, target.stat)
            if not target.met(bound):
                lat.notes.append(
                    f"the floor itself measured {target.stat} {bound:.2f} ms here, missing "
                    f"{target.text('ms')}: a grpc.aio server doing no work misses it on this machine"
                )
    return [lat, rate, floor]
