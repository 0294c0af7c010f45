"""`hvconform bench`: every figure on a local node, then bench.json, bench.md and `--compare`."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from hvconform.bench import procfs
from hvconform.bench.figures_host import RssSampler, suite_wall_time
from hvconform.bench.harness import Bench
from hvconform.bench.report import (
    SCHEMA,
    Figure,
    compare,
    compare_warnings,
    load_report,
    render_compare,
    write_reports,
)
from hvconform.bench.steps import Subject, announce, measure
from hvconform.bench.versus import side_by_side
from hvconform.bench.waits import FULL, QUICK, Plan
from hvconform.contract.args import OneLineParser, output_problem
from hvconform.contract.plugin import PluginUnderTest, ProfileError, load_profile
from hvconform.contract.safeyaml import excerpt
from hvconform.contract.strict_json import one_line
from hvconform.kubelet import LoopThread

# Figures that are correctness, not speed: any miss fails the run (exit 1).
MUST_HOLD = (
    "storm.torn",
    "storm.failed",
    "repair.allocate.stale_answers",
    "refusal.wrongly_granted",
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `bench` to hvconform's subcommands."""
    parser = sub.add_parser(
        "bench",
        help="benchmark the plugin on a local node against the seed's live figures",
        description="Runs the real plugin (python -m hv_device_plugin) against the kubelet emulator in a "
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
    parser.add_argument(
        "--skip-suite",
        action="store_true",
        help="do not measure the suite's wall time (two full hvconform runs, minutes each)",
    )
    parser.add_argument(
        "--versus",
        default="",
        metavar="PROFILE",
        help="a plugin profile (as hvconform run --plugin-profile): the same figures for that "
        "plugin, taking turns with ours in every step, and a side-by-side table in bench.md "
        "(compare like for like: fixtures/plugins/go-kvm/profile-bench.yaml advertises as many "
        "device IDs as ours)",
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
    versus = None
    if ns.versus:
        try:
            versus = load_profile(ns.versus)
        except ProfileError as exc:
            print(f"hvconform bench: --versus {one_line(str(exc))}", file=sys.stderr)
            return 2
        problem = _command_problem(versus)
        if problem:
            print(f"hvconform bench: --versus {excerpt(ns.versus, 200)}: {one_line(problem)}",
                  file=sys.stderr)  # fmt: skip
            return 2
    if os.geteuid() != 0 or not Path("/dev/kvm").exists():
        print("hvconform bench: needs root (mknod, tmpfs mounts) and /dev/kvm", file=sys.stderr)
        return 2
    plan = QUICK if ns.quick else FULL
    if ns.skip_suite:
        plan = dataclasses.replace(plan, suite=False)
    data, failures = run(plan, out, quick=ns.quick, versus=versus)
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


def run(
    plan: Plan, out: Path, *, quick: bool, versus: PluginUnderTest | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Measure everything (for both plugins with `versus`); the bench.json data and failures."""
    started_wall = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    started = time.monotonic()
    machine = procfs.machine()
    machine["load_start"] = procfs.loadavg()
    jiffies = procfs.cpu_jiffies()
    out.mkdir(parents=True, exist_ok=True)
    subjects: list[Subject] = []
    failures: list[str] = []
    wanted: list[tuple[str, PluginUnderTest | None, Path]] = [("ours", None, out / "plugin.log")]
    if versus is not None:
        wanted.append(("theirs", versus, out / f"plugin-{_slug(versus.name)}.log"))
    # Every emulator and every grpc.aio client of the harness on one loop (see loopthread).
    loop = LoopThread()
    try:
        for label, plugin, log in wanted:
            bench = Bench(log, plugin, loop)
            subjects.append(Subject(label, bench, RssSampler(bench)))
            bench.prepare()
        for subject in subjects:
            subject.bench.__enter__()
        loop.run(
            lambda: measure(subjects, plan, lambda figs: summary([f.to_json() for f in figs])),
            0,  # unbounded: every step bounds its own waits
            "the bench's steps",
        )
    except Exception as exc:  # set-up failed: still tear down and report what we have
        traceback.print_exc()
        failures.append(f"set-up: {type(exc).__name__}: {exc}")
    finally:
        cleanup = [(s, s.bench.close()) for s in subjects]
        loop.close()
    data: dict[str, Any] = {}
    for subject, left in cleanup:
        mine = subject.failures + ([f"left behind: {left}"] if left else [])
        if subject.bench.exit_code not in (0, None):
            mine.append(f"plugin exited {subject.bench.exit_code} on SIGTERM")
        figures = subject.figures()
        if subject.label == "ours":
            announce("suite wall time")
            try:
                figures += suite_wall_time(plan, out)
            except Exception as exc:
                mine.append(f"suite wall time: {type(exc).__name__}: {exc}")
        misses = [
            f"{f.name}: {f.median:g} {f.unit}"
            for f in figures
            if f.key in MUST_HOLD and f.target_met is False
        ]
        part = _part(subject, figures, left, plan, quick)
        if subject.label == "ours":
            failures += mine + misses
            data.update(part)
        else:  # the rival's correctness is its own affair; a broken step is the bench's
            failures += [f"{subject.bench.name}: {m}" for m in mine]
            part["correctness_misses"] = misses
            data["versus"] = part
    machine["load_end"] = procfs.loadavg()
    machine["busy_pct"] = procfs.busy_pct(jiffies, procfs.cpu_jiffies())
    head: dict[str, Any] = {"schema": SCHEMA, "quick": quick, "started": started_wall}
    head |= {"duration_s": time.monotonic() - started, "machine": machine}
    head["plan"] = {k: getattr(plan, k) for k in plan.__dataclass_fields__}
    data = head | data
    data.setdefault("figures", [])
    data.setdefault("notes", [])
    if "versus" in data:
        lacks = dict(cleanup[1][0].lacks) if len(cleanup) > 1 else {}
        data["side_by_side"] = side_by_side(data["figures"], data["versus"]["figures"], lacks)
    data["notes"] += [f"FAILED: {f}" for f in failures]
    return data, failures


def _command_problem(plugin: PluginUnderTest) -> str:
    """Why the profile's command cannot start (checked before the machine is touched)."""
    if plugin.dra is not None:
        return "a DRA driver: the bench measures device plugins against the kubelet emulator"
    program = Path(plugin.argv()[0])
    if not program.is_absolute():
        return ""  # found on PATH by the launcher, which says so if it is not
    if not program.is_file() or not os.access(program, os.X_OK):
        return (
            f"command {excerpt(str(program), 200)} is not an executable file "
            "(a fixture? ./dev nox -s fixture-plugins)"
        )
    return ""


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:40]


def _part(
    subject: Subject, figures: list[Figure], left: list[str], plan: Plan, quick: bool
) -> dict[str, Any]:
    """One plugin's share of bench.json."""
    bench = subject.bench
    notes = [
        "Timing: time.monotonic() (CLOCK_MONOTONIC) in the harness, the reader and the kubelet "
        "emulator; the load generator times its own calls with time.perf_counter().",
        f"The plugin ({bench.name}) runs from its profile ({bench.plugin.source}) with its own "
        "defaults, in the suite's sandbox (own mount and network namespaces, no capabilities); "
        "the CDI dir and any host-device view are tmpfs (a node's /run/cdi is tmpfs).",
    ]
    if bench.stop_s is not None:
        notes.append(
            f"Plugin stop (SIGTERM -> exit, with the kubelet's stream open): {bench.stop_s:.2f} s."
        )
    if quick:
        notes.append("--quick: sample counts below issue #7's minimums; not for comparison.")
    return {
        "plugin": bench.plugin.summary(),
        "devices": bench.slots,  # IDs advertised: every device list sent is this long
        "figures": [f.to_json() for f in figures],
        "threads_idle": subject.threads,
        "lacks": subject.lacks,
        "notes": notes,
        "cleanup": {
            "left_behind": left,
            "plugin_exit_code": bench.exit_code,
            "plugin_stop_s": bench.stop_s,
        },
    }


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
    """`python -m hvconform.bench.cli`: the same as `hvconform bench`."""
    parser: argparse.ArgumentParser = OneLineParser(prog="hvconform")
    register(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    code: int = ns.func(ns)
    return code


if __name__ == "__main__":
    sys.exit(main())
