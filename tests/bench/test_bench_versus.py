"""`hvconform bench --versus`: rounds merged, the side-by-side arithmetic, and a short real run
of ours against the Go fixture plugin (fixtures/plugins/go-kvm), each started from its profile."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvconform.bench import cli
from hvconform.bench.report import figure, write_reports
from hvconform.bench.versus import merge, share, side_by_side
from hvconform.bench.waits import FULL, Plan
from hvconform.contract.plugin import load_profile
from tests.fixture_plugins import build_go_kvm

REPO = Path(__file__).resolve().parents[2]
GO_KVM_PROFILE = REPO / "fixtures" / "plugins" / "go-kvm" / "profile.yaml"
# Few samples, both plugins, two rounds each: the machinery, not the numbers.
TINY = Plan(
    warmup=1,
    cdi_injections=2,
    restarts=2,
    plugin_restarts=2,
    refusals=2,
    health_samples=2,
    stream_counts=(1, 2),
    alloc_requests=((1, 20), (4, 40)),
    alloc_warmup=5,
    alloc_isolated=4,
    storm_min_reads=1000,
    storm_min_cycles=2,
    storm_min_s=0.4,
    idle_s=2.0,
    idle_window_s=0.5,
    suite=False,
)


def test_rounds_merge_their_samples_and_counts_add_up() -> None:
    a = figure("x", "X", "m", "ms", [0.001, 0.003], scale=1000.0, notes=["n"])
    b = figure("x", "X", "m", "ms", [0.002], scale=1000.0, notes=["n"])
    merged = merge([a, b])
    assert (merged.samples, merged.median, merged.max) == (3, 2.0, 3.0)
    assert merged.notes[0] == "n" and "2 rounds" in merged.notes[-1]
    count_a, count_b = figure("c", "C", "m", "reads", [0.0]), figure("c", "C", "m", "reads", [2.0])
    count_a.samples, count_b.samples = 500, 700
    total = merge([count_a, count_b])
    assert (total.samples, total.median) == (1200, 2.0)
    half = share(FULL, 2)
    assert (half.cdi_injections, half.idle_s, half.alloc_requests) == (
        15,
        30.0,
        ((1, 1000), (16, 4000)),
    )
    assert share(FULL, 1) is FULL


def test_side_by_side_says_who_is_ahead_and_what_is_missing() -> None:
    def fig(key: str, median: float, better: str = "lower", unit: str = "ms") -> dict[str, object]:
        return figure(key, key, "m", unit, [median], better=better).to_json()

    ours = [
        fig("start.ready", 10.0),
        fig("allocate.c1.rate", 100.0, "higher", "allocations/s"),
        fig("cdi.deletion.spec", 2.0),
        fig("allocate.c1.floor", 1.0),
        fig("idle.cpu", 0.05, unit="% of a core"),
    ]
    theirs = [
        fig("start.ready", 30.0),
        fig("allocate.c1.rate", 300.0, "higher", "allocations/s"),
        fig("allocate.c1.floor", 1.0),
        fig("idle.cpu", 0.0, unit="% of a core"),
        fig("only.theirs", 1.0),
    ]
    rows = {r["key"]: r for r in side_by_side(ours, theirs, {"cdi.": "no CDI spec"})}
    assert (rows["start.ready"]["ahead"], rows["start.ready"]["ratio"]) == ("ours", 3.0)
    rate = rows["allocate.c1.rate"]
    assert (rate["ahead"], round(rate["ratio"], 3)) == ("theirs", 0.333)
    assert rows["cdi.deletion.spec"]["note"] == "theirs: no CDI spec"
    assert rows["allocate.c1.floor"]["ahead"] == "" and "floor" in rows["allocate.c1.floor"]["note"]
    assert rows["idle.cpu"]["ahead"] == "equal"  # below what 10 ms CPU ticks resolve
    assert rows["only.theirs"]["note"] == "ours: not measured"


def test_versus_refuses_a_bad_profile_or_an_unbuilt_command(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="hvconform")
    cli.register(parser.add_subparsers(dest="command", required=True))
    bad = tmp_path / "bad.yaml"
    bad.write_text("command: 7\n")
    unbuilt = tmp_path / "unbuilt.yaml"
    unbuilt.write_text('command: ["{profile_dir}/bin/nothing-here"]\n')
    for profile, words in ((bad, "command"), (unbuilt, "not an executable file")):
        argv = [sys.executable, "-m", "hvconform.cli", "bench", "--versus", str(profile)]
        argv += ["--out", str(tmp_path / "out")]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.root
@pytest.mark.kvm
def test_a_short_versus_run_writes_the_side_by_side_table(tmp_path: Path) -> None:
    assert os.geteuid() == 0 and Path("/dev/kvm").exists(), "needs root and /dev/kvm"
    build_go_kvm()
    before = {p.name for p in Path("/tmp").glob("hvb-*")}
    out = tmp_path / "out"
    data, failures = cli.run(TINY, out, quick=True, versus=load_profile(GO_KVM_PROFILE))
    assert failures == []
    assert (
        data["plugin"]["name"] == "hv-device-plugin"
        and data["versus"]["plugin"]["name"] == "go-kvm"
    )
    rows = {r["key"]: r for r in data["side_by_side"]}
    for key in (
        "cdi.deletion.spec",
        "repair.allocate.answer",
        "allocate.c1.latency",
        "health.unhealthy.2",
        "refusal.allocate",
        "idle.cpu",
        "memory.idle",
        "reregister.crash",
        "start.ready",
    ):
        row = rows[key]
        assert row["ours"]["median"] is not None and row["theirs"]["median"] is not None, key
        assert row["ahead"] in ("ours", "theirs", "equal"), key
    # Two rounds per plugin, each with its share of the samples, merged into one figure.
    assert rows["start.ready"]["ours"]["samples"] == rows["start.ready"]["theirs"]["samples"] == 2
    assert rows["refusal.wrongly_granted"]["theirs"]["median"] == 0
    for part in (data, data["versus"]):
        assert part["cleanup"]["left_behind"] == [] and part["cleanup"]["plugin_exit_code"] == 0
    assert {p.name for p in Path("/tmp").glob("hvb-*")} <= before
    write_reports(data, out)
    md = (out / "bench.md").read_text()
    assert "| Figure | Unit | hv-device-plugin median | hv-device-plugin p95 | go-kvm median" in md
    assert (out / "plugin-go-kvm.log").stat().st_size > 0
