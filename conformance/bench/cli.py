"""`hvconform bench`: every figure on a local node, then bench.json, bench.md and `--compare`."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from conformance.bench import procfs
from conformance.bench.figures_alloc import allocate_load
from conformance.bench.figures_cdi import cdi_recovery
from conformance.bench.figures_grpc import health_propagation, reregistration
from conformance.bench.figures_host import (
    RssSampler,
    idle_footprint,
    memory_figures,
    suite_wall_time,
)
from conformance.bench.figures_storm import read_storm
from conformance.bench.harness import FULL, QUICK, Bench, Plan
from conformance.bench.report import (
    SCHEMA,
    Figure,
    compare,
    compare_warnings,
    load_report,
    render_compare,
    write_reports,
)
from conformance.contract.args import OneLineParser, output_problem
from conformance.contract.strict_json import one_line

# Figures that are correctness, not speed: any miss fails the run (exit 1).
MUST_HOLD = ("storm.torn", "storm.failed", "repair.allocate.stale_answers")
FRESH_S = 3.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `bench` to hvconform's subcommands."""
    parser = sub.add_parser(
        "bench",
        help="benchmark the plugin on a local node against the seed's live figures",
        description="Runs the real plugin (python -m plugin) against the kubelet emulator in a "
        "per-run /tmp node and measures CDI recovery, allocation-triggered repair, "
        "re-registration, health propagation, Allocate latency, a read storm, memory, idle CPU "
        "and wake-ups, and the suite's wall time. Exit 1 when a correctness figure (torn or "
        "failed reads, stale Allocate answers) fails, a step errs, or something is left behind; "
        "missed speed targets are reported, not fatal. Needs root and /dev/kvm.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--out", default="reports/bench", help="where bench.json and bench.md go")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer samples, 10 s idle window, suite wall time skipped (below issue #7 minimums)",
    )
    parser.add_argument(
        "--compare",
        default="",
        metavar="OLD.json",
        help="an older bench.json: print new/old per figure, flag regressions > 20 %%",
    )
    parser.set_defaults(func=runner)


def runner(ns: argparse.Namespace) -> int:
    # Every input first (the old report, the output dir), then the machine: one line, exit 2.
    old = None
    if ns.compare:
        old = load_report(
            Path(ns.compare), lambda m: print(f"hvconform bench: {one_line(m)}", file=sys.stderr)
        )
        if old is None:
            return 2
    out = Path(ns.out).resolve()
    problem = output_problem("--out", out, must_be_empty=False)
    if problem:
        print(f"hvconform bench: {one_line(problem)}", file=sys.stderr)
        return 2
    if os.geteuid() != 0 or not Path("/dev/kvm").exists():
        print("hvconform bench: needs root (mknod, tmpfs mounts) and /dev/kvm", file=sys.stderr)
        return 2
    data, failures = run(QUICK if ns.quick else FULL, out, quick=ns.quick)
    if old is not None:
        data["compare"] = compare(data, old)
        data["compare_warnings"] = compare_warnings(data, old)
        lines = ["", f"compared with {ns.compare}:", *render_compare(data["compare"])]
        lines += [f"warning: {w}" for w in data["compare_warnings"]]
        flagged = [r["name"] for r in data["compare"] if r["regression"]]
        lines.append(f"{len(flagged)} figure(s) more than 20 % worse: {', '.join(flagged) or '-'}")
        print("\n".join(lines))
    json_path, md_path = write_reports(data, out)
    print(summary(data["figures"]))
    for failure in failures:
        print(f"hvconform bench: FAILED: {failure}", file=sys.stderr)
    print(f"hvconform bench: {json_path} and {md_path}")
    return 1 if failures else 0


def run(plan: Plan, out: Path, *, quick: bool) -> tuple[dict[str, Any], list[str]]:
    """Measure everything; returns the bench.json data and what failed."""
    started_wall = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    started = time.monotonic()
    machine = procfs.machine()
    machine["load_start"] = procfs.loadavg()
    jiffies = procfs.cpu_jiffies()
    figures: list[Figure] = []
    threads: list[dict[str, Any]] = []
    failures: list[str] = []
    out.mkdir(parents=True, exist_ok=True)
    bench = Bench(out / "plugin.log")
    try:
        bench.__enter__()
        asyncio.run(_measure(bench, plan, figures, threads, failures))
    except Exception as exc:  # set-up failed: still tear down and report what we have
        traceback.print_exc()
        failures.append(f"set-up: {type(exc).__name__}: {exc}")
    finally:
        left = bench.close()
    if left:
        failures.append(f"left behind: {left}")
    if bench.exit_code not in (0, None):
        failures.append(f"plugin exited {bench.exit_code} on SIGTERM (see {bench.log_path})")
    _step("suite wall time")
    try:
        figures += suite_wall_time(plan, out)
    except Exception as exc:
        failures.append(f"suite wall time: {type(exc).__name__}: {exc}")
    failures += [
        f"{f.name}: {f.median:g} {f.unit}"
        for f in figures
        if f.key in MUST_HOLD and f.target_met is False
    ]
    machine["load_end"] = procfs.loadavg()
    machine["busy_pct"] = procfs.busy_pct(jiffies, procfs.cpu_jiffies())
    notes = [
        "Timing: time.monotonic() (CLOCK_MONOTONIC) in the harness, the reader and the kubelet "
        "emulator; the load generator times its own calls with time.perf_counter().",
        "The CDI dir and the host-dev view are tmpfs (a node's /run/cdi is tmpfs); the plugin "
        "runs with its defaults (2000 slots, 5 s re-check, info logs) in a private mount "
        "namespace.",
    ]
    if bench.stop_s is not None:
        notes.append(
            f"Plugin stop (SIGTERM -> exit, with the kubelet's stream open): {bench.stop_s:.2f} s."
        )
    if quick:
        notes.append("--quick: sample counts below issue #7's minimums; not for comparison.")
    notes += [f"FAILED: {f}" for f in failures]
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "quick": quick,
        "started": started_wall,
        "duration_s": time.monotonic() - started,
        "machine": machine,
        "plan": {k: getattr(plan, k) for k in plan.__dataclass_fields__},
        "figures": [f.to_json() for f in figures],
        "threads_idle": threads,
        "notes": notes,
        "cleanup": {
            "left_behind": left,
            "plugin_exit_code": bench.exit_code,
            "plugin_stop_s": bench.stop_s,
        },
    }
    return data, failures


def _step(name: str) -> None:
    print(f"hvconform bench: {name} (load {procfs.loadavg()[0]:.2f})", flush=True)


async def _measure(
    bench: Bench,
    plan: Plan,
    figures: list[Figure],
    threads: list[dict[str, Any]],
    failures: list[str],
) -> None:
    rss = RssSampler(bench)

    async def fresh() -> list[Figure]:
        async with rss.sampling("fresh"):
            await asyncio.sleep(FRESH_S)
        return []

    async def idle() -> list[Figure]:
        figs, rows = await idle_footprint(bench, plan, rss)
        threads.extend(rows)
        return figs + memory_figures(rss)

    # Order matters: the idle window follows every load phase; kubelet restarts come last
    # because they replace the plugin's server (and so every stream on it).
    steps: list[tuple[str, Callable[[], Awaitable[list[Figure]]]]] = [
        ("memory after start", fresh),
        ("CDI recovery", lambda: cdi_recovery(bench, plan)),
        ("allocation-triggered repair under a read storm", lambda: read_storm(bench, plan)),
        ("Allocate load", lambda: allocate_load(bench, plan, rss)),
        ("health propagation", lambda: health_propagation(bench, plan, rss)),
        (f"idle footprint ({plan.idle_s:g} s)", idle),
        ("re-registration after kubelet restarts", lambda: reregistration(bench, plan)),
    ]
    for name, step in steps:
        _step(name)
        try:
            new = await step()
        except Exception as exc:
            traceback.print_exc()
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        figures += new
        print(summary([f.to_json() for f in new]), flush=True)


def summary(figures: list[dict[str, Any]]) -> str:
    """One line per figure: median, p95, max, the seed ratio and the target verdict."""
    lines = []
    for f in figures:
        if f["median"] is None:
            lines.append(f"  {f['name']}: no samples ({'; '.join(f['notes'])})")
            continue
        ratio = f", {f['seed_ratio']:,.0f}x ahead of the seed" if f["seed_ratio"] else ""
        verdict = ""
        if f["targets"]:
            verdict = (
                f"; target {', '.join(f['targets'])}: {'met' if f['target_met'] else 'MISSED'}"
            )
        lines.append(
            f"  {f['name']}: median {f['median']:.4g}, p95 {f['p95']:.4g}, p99 {f['p99']:.4g}, "
            f"max {f['max']:.4g} {f['unit']} (n={f['samples']}){ratio}{verdict}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m conformance.bench.cli`: the same as `hvconform bench`."""
    parser: argparse.ArgumentParser = OneLineParser(prog="hvconform")
    register(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    code: int = ns.func(ns)
    return code


if __name__ == "__main__":
    sys.exit(main())
