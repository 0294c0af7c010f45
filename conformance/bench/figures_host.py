"""The plugin's footprint (memory, idle CPU, idle wake-ups per thread) and the suite's wall time."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from hvconform.bench import procfs
from hvconform.bench.harness import Bench, floor_server
from hvconform.bench.report import Figure, Target, figure
from hvconform.bench.waits import BenchTimeout, Plan

RSS_EVERY_S = 0.1
IDLE_SETTLE_S = 3.0  # after the previous phase: let late callbacks and log flushes finish
IDLE_TICK_S = 0.1  # thread counters are read this often: one "wake episode" per tick at most
MIB = 1024.0
MIN_GAPS = 5  # fewer wake episodes than this in the window: nothing periodic to speak of
# A 1 s period read with 100 ms ticks shows as 0.9-1.1 s gaps: one tick of resolution allowed.
PERIOD_TOLERANCE = 1.0 + IDLE_TICK_S


class RssSampler:
    """Resident memory of the plugin and its probe helper, sampled while a phase runs."""

    def __init__(self, bench: Bench) -> None:
        self._bench = bench
        self.phases: dict[str, list[tuple[int, int]]] = {}  # phase -> (plugin KiB, helper KiB)

    def take(self) -> tuple[int, int]:
        pid = self._bench.pid
        helpers = procfs.process_tree(pid)[1:]
        return procfs.rss_kib(pid), sum(procfs.rss_kib(p) for p in helpers)

    @contextlib.asynccontextmanager
    async def sampling(self, phase: str) -> AsyncIterator[None]:
        samples = self.phases.setdefault(phase, [])

        async def loop() -> None:
            while True:
                samples.append(self.take())
                await asyncio.sleep(RSS_EVERY_S)

        task = asyncio.ensure_future(loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def figure(self, key: str, name: str, phases: list[str], method: str) -> Figure:
        pairs = [p for phase in phases for p in self.phases.get(phase, [])]
        fig = figure(key, name, method, "MiB", [(a + b) / MIB for a, b in pairs])
        if pairs:
            plugin = statistics.median(a for a, _ in pairs) / MIB
            helper = statistics.median(b for _, b in pairs) / MIB
            fig.notes.append(
                f"median split: plugin {plugin:.1f} MiB, probe helper {helper:.1f} MiB"
            )
        return fig


def memory_figures(rss: RssSampler) -> list[Figure]:
    how = "VmRSS of the plugin plus its probe helper (/proc/<pid>/status), sampled every 100 ms"
    return [
        rss.figure(
            "memory.fresh",
            "Resident memory, idle after start",
            ["fresh"],
            f"{how}, for 3 s once the plugin was registered and every slot allocatable.",
        ),
        rss.figure(
            "memory.load",
            "Resident memory under load",
            ["Allocate c=1", "Allocate c=16", "100 streams"],
            f"{how}, during the Allocate load runs and the 100-stream health propagation.",
        ),
        rss.figure(
            "memory.idle",
            "Resident memory, idle after load",
            ["idle"],
            f"{how}, over the idle window that follows every load phase.",
        ),
    ]


class _Threads:
    """Per-thread voluntary switches and CPU of some processes, read every tick."""

    def __init__(self, names: dict[int, str], python: bool = True) -> None:
        self.names = names
        self.python = python  # else every thread is the plugin's own (no grpc core to tell apart)
        self.first = self.prev = self._read()
        self.episodes: dict[tuple[int, int], list[float]] = {k: [] for k in self.first}

    def _read(self, where: bool = False) -> dict[tuple[int, int], procfs.ThreadSample]:
        return {(t.pid, t.tid): t for p in self.names for t in procfs.threads(p, where=where)}

    def tick(self) -> int:
        """Stamp a wake episode for every thread whose switches grew; total switches now."""
        cur = self._read()
        now = time.monotonic()
        for key, t in cur.items():
            before = self.prev.get(key)
            if before is None or t.voluntary > before.voluntary:
                self.episodes.setdefault(key, []).append(now)
        self.prev = cur
        return sum(t.voluntary for t in cur.values())

    def rows(self, elapsed: float) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for key, t in sorted(self._read(where=True).items()):
            base = self.first.get(key)
            wakes = t.voluntary - (base.voluntary if base else 0)
            run_ns = t.runtime_ns - (base.runtime_ns if base else 0)
            role = " main" if t.tid == t.pid else ""
            stamps = self.episodes.get(key, [])
            gaps = [b - a for a, b in itertools.pairwise(stamps)]
            # The typical gap between wake episodes: a periodic wake-up shows as its period.
            period = statistics.median(gaps) if len(gaps) >= MIN_GAPS else None
            rows.append(
                {
                    "process": self.names.get(t.pid, "?"),
                    "tid": t.tid,
                    # Python threads are all "python"; grpc's C threads name themselves.
                    "grpc": self.python and t.comm != "python",
                    "comm": f"{t.comm}{role}, sleeps in {t.blocked_in}",
                    "wakeups_per_s": wakes / elapsed,
                    "episodes_per_s": len(stamps) / elapsed,
                    "period_s": period,
                    "cpu_ms_per_min": run_ns / 1e6 / (elapsed / 60.0),
                    "new_during_window": base is None,
                }
            )
        return rows


async def idle_footprint(
    bench: Bench, plan: Plan, rss: RssSampler
) -> tuple[list[Figure], list[dict[str, Any]]]:
    """Idle CPU (thread group stat) and voluntary switches per thread, over plan.idle_s; a bare
    grpc.aio server (the floor) idles beside it, to show what grpc alone wakes for."""
    async with floor_server(bench) as (_sock, floor_pid):
        await asyncio.sleep(IDLE_SETTLE_S)
        span = procfs.Span()
        pids = bench.tree()
        plugin = _Threads(
            {pids[0]: bench.name, **{p: "probe helper" for p in pids[1:]}}, bench.python
        )
        floor = _Threads({floor_pid: "floor: bare grpc.aio server"})

        def cpu() -> float:
            return sum(procfs.cpu_seconds(p) for p in pids)

        cpu0 = cpu_w = cpu()
        wakes_w, floor_wakes0 = plugin.tick(), floor.tick()
        cpu_pct: list[float] = []
        wake_rates: list[float] = []
        started = window = time.monotonic()
        async with rss.sampling("idle"):
            while (now := time.monotonic()) - started < plan.idle_s:
                await asyncio.sleep(IDLE_TICK_S)
                wakes, _ = plugin.tick(), floor.tick()
                if now - window >= plan.idle_window_s:
                    c = cpu()
                    cpu_pct.append(100.0 * (c - cpu_w) / (now - window))
                    wake_rates.append((wakes - wakes_w) / (now - window))
                    cpu_w, wakes_w, window = c, wakes, now
        elapsed = time.monotonic() - started
        cpu_total = cpu() - cpu0
        floor_rate = (floor.tick() - floor_wakes0) / elapsed
        rows = plugin.rows(elapsed)
        floor_rows = floor.rows(elapsed)
    figures, table = _idle_figures(
        plan, elapsed, cpu_pct, cpu_total, wake_rates, rows, floor_rows, floor_rate
    )
    for fig in figures:
        fig.load = span.load()
    return figures, table


def _idle_figures(
    plan: Plan,
    elapsed: float,
    cpu_pct: list[float],
    cpu_total: float,
    wake_rates: list[float],
    rows: list[dict[str, Any]],
    floor_rows: list[dict[str, Any]],
    floor_rate: float,
) -> tuple[list[Figure], list[dict[str, Any]]]:
    window_text = f"{plan.idle_window_s:g} s windows over {elapsed:.0f} s idle"
    idle_how = (
        "registered, the emulator's ListAndWatch stream open, no other client, after every "
        "load phase"
    )
    periodic = (
        f"per thread, the {IDLE_TICK_S * 1000:.0f} ms ticks in which its voluntary switches "
        "grew are its wake episodes (a burst in one tick counts once); 1 / the median gap "
        f"between them is its periodic rate (threads with at least {MIN_GAPS} gaps); one sample "
        "per thread, so max is the fastest"
    )
    own = [r for r in rows if not r["grpc"]]
    grpc_threads = [r for r in rows if r["grpc"]]
    figures = [
        figure(
            "idle.cpu",
            "Idle CPU, plugin + probe helper",
            f"utime+stime of both thread groups (/proc/<pid>/stat) per {window_text}; {idle_how}.",
            "% of a core",
            cpu_pct,
            targets=[Target("max", 1.0)],
        ),
        figure(
            "idle.cpu_per_hour",
            "Idle CPU seconds per hour",
            f"The same CPU time over the whole {elapsed:.0f} s window, scaled to one hour.",
            "CPU s/h",
            [cpu_total / elapsed * 3600.0],
        ),
        figure(
            "idle.wakeups",
            "Idle wake-ups per second, all threads",
            "Voluntary context switches of every plugin and helper thread "
            f"(/proc/<pid>/task/*/status) per {window_text}.",
            "wake-ups/s",
            wake_rates,
            notes=[f"a bare grpc.aio server idling beside it: {floor_rate:.2f} wake-ups/s"],
        ),
        figure(
            "idle.thread_rate.own",
            "Idle periodic wake-up rate, plugin's own threads",
            f"Python threads of the plugin and the probe helper (event loop, executor, "
            f"watchers): {periodic}. Target: none faster than once a second (one 100 ms tick "
            "of resolution allowed).",
            "1/s",
            [1.0 / r["period_s"] for r in own if r["period_s"]],
            targets=[Target("max", PERIOD_TOLERANCE, "<=")],
        ),
        figure(
            "idle.thread_rate.grpc",
            "Idle periodic wake-up rate, grpc core threads",
            f"grpc's own C threads in the plugin (timer, event engine, lifeguard): {periodic}.",
            "1/s",
            [1.0 / r["period_s"] for r in grpc_threads if r["period_s"]],
        ),
    ]
    for fig, group in ((figures[3], own), (figures[4], grpc_threads)):
        if fig.samples == 0:
            fig.notes.append(f"no thread had {MIN_GAPS} gaps between wake episodes: none periodic")
            fig.target_met = True if fig.targets else None
        fast = [r for r in group if r["period_s"] and 1.0 / r["period_s"] > PERIOD_TOLERANCE]
        if fast:
            fig.notes.append(
                "periodic faster than once a second: "
                + "; ".join(f"{r['comm']} (every {r['period_s']:.2f} s)" for r in fast)
            )
    floor_text = ", ".join(
        f"{r['comm'].split(',')[0]} {r['wakeups_per_s']:.2f}/s" for r in floor_rows if r["grpc"]
    )
    figures[4].notes.append(
        f"the same grpc threads in a bare grpc.aio server with no client: {floor_text} (grpc "
        "core's work-stealing pool: lifeguard re-checks at most 1 s apart, workers at most 3 s, "
        "hard-coded; the timer thread ticks too): not the plugin's doing"
    )
    return figures, rows + floor_rows


def suite_wall_time(plan: Plan, log_dir: Path) -> list[Figure]:
    """`hvconform run` serial and with `-n auto`, in subprocesses; their wall time in seconds."""
    figures = []
    for label, extra in (("serial", []), ("-n auto", ["-n", "auto"])):
        slug = "serial" if not extra else "parallel"
        name = f"Suite wall time, hvconform run {label}"
        command = " ".join(["hvconform run", *extra])
        method = (
            f"`{command}` (every check, local node target) as a "
            "subprocess, after the bench node was torn down; wall time of the whole command."
        )
        if not plan.suite:
            fig = figure(f"suite.{slug}", name, method, "s", [])
            fig.notes.append("skipped (--quick or --skip-suite): run without either to measure it")
            figures.append(fig)
            continue
        span = procfs.Span()
        wall, code, counts = _run_suite(extra, plan.suite_timeout_s, log_dir / f"suite-{slug}.log")
        fig = figure(f"suite.{slug}", name, method, "s", [wall], load=span.load())
        fig.notes.append(f"exit {code}; checks: {counts or 'no results.json'}")
        figures.append(fig)
    return figures


def _run_suite(extra: list[str], timeout_s: float, log: Path) -> tuple[float, int, str]:
    tmp = Path(tempfile.mkdtemp(prefix="hvb-suite-", dir="/tmp"))
    try:
        argv = [sys.executable, "-m", "hvconform.cli", "run", "--out", str(tmp / "run")]
        argv += ["--reports-root", str(tmp), *extra]
        started = time.monotonic()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                code = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
                raise BenchTimeout(f"hvconform run {' '.join(extra)}", timeout_s) from None
        wall = time.monotonic() - started
        results = tmp / "run" / "results.json"
        counts = ""
        if results.exists():
            run = json.loads(results.read_text())["run"]
            counts = ", ".join(f"{v} {k}" for k, v in sorted(run.get("counts", {}).items()))
        return wall, code, counts
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
