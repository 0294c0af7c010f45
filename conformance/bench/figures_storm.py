"""Allocation-triggered repair under a read storm.

A reader process reads the spec in a tight loop while the harness repeats: atomic stale
injection, Allocate (which repairs before it answers), wait for the desired bytes. Gives the
Allocate answer time, the time until the reader first saw the desired bytes, the sustained read
rate, and the torn and failed reads (which must be 0).
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api import deviceplugin_pb2_grpc as pb_grpc
from hvconform.bench.harness import Bench
from hvconform.bench.procfs import Span
from hvconform.bench.report import SEED_ALLOCATION_REPAIR_S, SEED_READS, Figure, Target, figure
from hvconform.bench.waits import Plan, poll_until, within

STEP_S = 10.0
DESIRED = 1  # index of the desired content among the reader's accepted contents


@dataclass(frozen=True)
class Cycle:
    injected: float  # just before the stale rename
    answered: float  # Allocate answer received
    stale_at_answer: bool  # the harness read stale bytes right after the answer


async def read_storm(bench: Bench, plan: Plan) -> list[Figure]:
    span = Span()
    work = Path(tempfile.mkdtemp(prefix="storm-", dir=bench.root))  # one per round
    (work / "stale").write_bytes(bench.stale)
    (work / "desired").write_bytes(bench.desired)
    ready, done, out = work / "ready", work / "done", work / "reads.json"
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "hvconform.readstorm", str(bench.spec_path)),
        *("--accept", str(work / "stale"), "--accept", str(work / "desired")),
        *("--out", str(out), "--ready", str(ready), "--done", str(done)),
        *("--min-reads", str(plan.storm_min_reads)),
    )
    bench.track(proc.pid, "reader")
    cycles: list[Cycle] = []
    try:
        await poll_until(ready.exists, STEP_S, "the reader process to start reading")
        cycles = await _cycles(bench, plan, done.exists)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await within(proc.wait(), STEP_S, "the reader process to exit after SIGTERM")
    stats = json.loads(out.read_text())
    return _figures(plan, cycles[plan.warmup :], stats, span.load())


async def _cycles(bench: Bench, plan: Plan, reads_done: Callable[[], bool]) -> list[Cycle]:
    cycles: list[Cycle] = []
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=bench.device_ids[:1])]
    )
    want = bench.cdi_names
    started = time.monotonic()
    deadline = started + plan.storm_max_s
    async with grpc.aio.insecure_channel(f"unix:{bench.socket()}") as channel:
        await within(channel.channel_ready(), STEP_S, "a channel to the plugin")
        stub = pb_grpc.DevicePluginStub(channel)
        while True:
            i = len(cycles)
            t0 = time.monotonic()
            bench.replace_spec(bench.stale)
            answer = await within(
                stub.Allocate(request, timeout=STEP_S), STEP_S, f"Allocate in storm cycle {i}"
            )
            t1 = time.monotonic()
            stale = bench.spec_bytes() != bench.desired
            names = [d.name for c in answer.container_responses for d in c.cdi_devices]
            if names != want:
                raise RuntimeError(f"storm cycle {i}: Allocate answered CDI devices {names}")
            await poll_until(
                lambda: bench.spec_bytes() == bench.desired,
                STEP_S,
                f"the desired spec after storm cycle {i}",
            )
            cycles.append(Cycle(t0, t1, stale))
            await asyncio.sleep(random.uniform(*plan.gap_s))  # noqa: S311 - jitter, not crypto
            enough = len(cycles) >= plan.warmup + plan.storm_min_cycles
            if enough and time.monotonic() - started >= plan.storm_min_s and reads_done():
                return cycles
            if time.monotonic() > deadline:
                return cycles  # reported short: the figures say how many reads there were


def _first_seen(cycles: list[Cycle], transitions: list[list[float]]) -> tuple[list[float], int]:
    """Per cycle, injection -> the reader's first read of the desired bytes after it."""
    seen: list[float] = []
    missed = 0
    for n, cyc in enumerate(cycles):
        until = cycles[n + 1].injected if n + 1 < len(cycles) else float("inf")
        hit = next(
            (t for t, idx in transitions if idx == DESIRED and cyc.injected < t < until), None
        )
        if hit is None:
            missed += 1  # the reader never saw the stale bytes, so no change to desired either
        else:
            seen.append(hit - cyc.injected)
    return seen, missed


def _figures(
    plan: Plan, cycles: list[Cycle], stats: dict[str, object], load: dict[str, float]
) -> list[Figure]:
    reads = int(str(stats["reads"]))
    errors = int(str(stats["errors"]))
    torn = int(str(stats["unexpected"]))
    elapsed = float(str(stats["elapsed_s"]))
    transitions = stats["transitions"]
    assert isinstance(transitions, list)
    seen, missed = _first_seen(cycles, transitions)
    stale_answers = sum(c.stale_at_answer for c in cycles)
    how = (
        f"{len(cycles)} cycles ({plan.warmup} warm-up cycles dropped) of: rename of a stale "
        "spec onto the spec, Allocate on one grpc.aio channel, wait for the desired bytes, "
        "20-60 ms pause; one reader process reading the spec in a tight loop throughout"
    )
    note_race = (
        "the plugin's directory watch also sees each stale rename, so the watch and Allocate "
        "race to repair; whichever wins, Allocate must not answer before the spec is desired"
    )
    answer = figure(
        "repair.allocate.answer",
        "Stale spec + Allocate -> answer",
        f"{how}; from just before the stale rename to the Allocate answer.",
        "ms",
        [c.answered - c.injected for c in cycles],
        scale=1000.0,
        notes=[note_race, f"{stale_answers} answers arrived while the harness still read stale"],
        load=load,
    )
    reader = figure(
        "repair.allocate.reader",
        "Stale spec + Allocate -> reader first sees desired",
        f"{how}; from just before the stale rename to the reader process's first read of the "
        "desired bytes after it (CLOCK_MONOTONIC stamps of both processes).",
        "ms",
        seen,
        scale=1000.0,
        seed=SEED_ALLOCATION_REPAIR_S * 1000.0,
        seed_text="2.93 s (first seen)",
        load=load,
    )
    if missed:
        reader.notes.append(
            f"{missed} cycles had no stale read in between (repair beat the reader)"
        )
    rate = figure(
        "storm.read_rate",
        "Read storm: reads per second",
        f"{how}; reads per whole second of the reader's run ({reads / elapsed:,.0f}/s overall).",
        "reads/s",
        [float(x) for x in stats["reads_per_second"]],  # type: ignore[attr-defined]
        better="higher",
        load=load,
    )
    total = _count(
        "storm.reads",
        "Read storm: reads during replacement",
        f"{how}; every read complete and either the stale or the desired bytes.",
        "reads",
        reads,
        1,
        better="higher",
        seed=float(SEED_READS),
        seed_text="6813 reads, 0 errors",
        targets=[Target("median", float(plan.storm_min_reads), ">=")],
        load=load,
        comparable=False,
    )
    bad = [
        _count(key, name, f"{how}; {what}", unit, value, of, targets=[Target("max", 0.0, "<=")])
        for key, name, what, unit, value, of in (
            (
                "storm.torn",
                "Read storm: torn or foreign reads",
                "count of reads neither stale nor desired (samples = reads)",
                "reads",
                torn,
                reads,
            ),
            (
                "storm.failed",
                "Read storm: failed reads",
                "count of open or read errors (samples = reads)",
                "reads",
                errors,
                reads,
            ),
            (
                "repair.allocate.stale_answers",
                "Allocate answered while the spec was stale",
                "count of answers after which the harness's own read still found the stale "
                "bytes (samples = cycles)",
                "answers",
                stale_answers,
                len(cycles),
            ),
        )
    ]
    if stats.get("samples"):
        bad[0].notes.append(f"first problem reads: {stats['samples']}")
    return [answer, reader, rate, total, *bad]


def _count(
    key: str, name: str, method: str, unit: str, value: int, of: int, **extra: Any
) -> Figure:
    """A one-number figure: the count is every statistic; `of` is how many things were counted."""
    fig = figure(key, name, method, unit, [float(value)], **extra)
    fig.samples = of
    return fig
