"""The bench machinery end to end with tiny sample counts: processes, figures, reports, cleanup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvconform.bench.cli import MUST_HOLD, run
from hvconform.bench.report import compare, render_markdown
from hvconform.bench.waits import Plan

needs_root_and_kvm = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/dev/kvm").exists(), reason="needs root and /dev/kvm"
)

SMOKE = Plan(
    warmup=1,
    cdi_injections=2,
    restarts=1,
    plugin_restarts=1,
    refusals=1,
    health_samples=1,
    stream_counts=(1, 3),
    alloc_requests=((1, 20), (4, 40)),
    alloc_warmup=5,
    alloc_isolated=5,
    storm_min_reads=2000,
    storm_min_cycles=2,
    storm_min_s=0.5,
    idle_s=2.0,
    idle_window_s=0.5,
    suite=False,
)


def _wait(path: Path, seconds: float) -> None:
    end = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < end, f"wait for {path} expired after {seconds} s"
        time.sleep(0.01)


def test_reader_classifies_reads_and_stamps_changes(tmp_path: Path) -> None:
    target, good, other = tmp_path / "spec", tmp_path / "good", tmp_path / "other"
    good.write_bytes(b"good")
    other.write_bytes(b"other")
    target.write_bytes(b"good")
    out, ready, done = tmp_path / "out.json", tmp_path / "ready", tmp_path / "done"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "hvconform.readstorm", str(target)),
            *("--accept", str(good), "--accept", str(other), "--out", str(out)),
            *("--ready", str(ready), "--done", str(done), "--min-reads", "1000"),
        ]
    )
    try:
        _wait(ready, 10)
        _wait(done, 10)
        tmp = tmp_path / "next"
        tmp.write_bytes(b"other")
        tmp.rename(target)
        time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    stats = json.loads(out.read_text())
    assert stats["reads"] >= 1000 and stats["errors"] == 0 and stats["unexpected"] == 0
    assert [index for _, index in stats["transitions"]] == [0, 1]


def test_loadgen_against_the_floor_server(tmp_path: Path) -> None:
    sock, out = tmp_path / "floor.sock", tmp_path / "load.json"
    server = subprocess.Popen(
        [sys.executable, "-m", "hvconform.bench.floor", str(sock), "--slots", "4"]
    )
    try:
        _wait(sock, 20)
        subprocess.run(
            [
                *(sys.executable, "-m", "hvconform.bench.loadgen", str(sock)),
                *("--concurrency", "3", "--requests", "30", "--warmup", "2", "--out", str(out)),
            ],
            check=True,
            timeout=60,
        )
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(10) == 0
    data = json.loads(out.read_text())
    assert data["errors"] == 0 and len(data["latencies_s"]) == 30
    assert all(0 < t < 10 for t in data["latencies_s"])


@pytest.mark.root
@pytest.mark.kvm
@needs_root_and_kvm
def test_tiny_bench_measures_every_figure_and_leaves_nothing(tmp_path: Path) -> None:
    before = {p.name for p in Path("/tmp").glob("hvb-*")}
    data, failures = run(SMOKE, tmp_path / "out", quick=True)
    assert failures == []
    keys = {f["key"]: f for f in data["figures"]}
    for kind in ("deletion", "corruption", "staleness"):
        assert keys[f"cdi.{kind}.spec"]["samples"] == 2
        assert keys[f"cdi.{kind}.spec"]["seed_ratio"] > 1
    for key in (
        "repair.allocate.answer",
        "storm.reads",
        "allocate.c1.latency",
        "allocate.c4.floor",
        "allocate.isolated.latency",
        "health.unhealthy.3",
        "health.floor.3",
        "idle.cpu",
        "memory.load",
        "reregister.graceful",
        "reregister.crash",
    ):
        assert keys[key]["median"] is not None, key
    for key in MUST_HOLD:
        assert keys[key]["max"] == 0, key
    assert keys["suite.serial"]["samples"] == 0
    # measured, or said why not; whether it meets its target is `nox -s bench`'s to judge (a
    # loaded CI machine wakes an idle process more often: 9.6/s was seen beside the node stack)
    own = keys["idle.thread_rate.own"]
    assert own["samples"] > 0 or own["notes"], own
    assert data["cleanup"]["left_behind"] == [] and data["cleanup"]["plugin_exit_code"] == 0
    assert 0 < data["cleanup"]["plugin_stop_s"] < 15
    assert {p.name for p in Path("/tmp").glob("hvb-*")} <= before
    assert (tmp_path / "out" / "plugin.log").exists()
    assert all(r["ratio"] == 1.0 and not r["regression"] for r in compare(data, data))
    assert "| CDI deletion -> byte-exact spec | 2 |" in render_markdown(data)
