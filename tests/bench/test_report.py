"""The bench's arithmetic and rendering: statistics, targets, seed ratios, bench.md, --compare."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from hvconform.bench import cli
from hvconform.bench.report import (
    SCHEMA,
    Better,
    Target,
    compare,
    compare_warnings,
    figure,
    load_report,
    nearest_rank,
    render_markdown,
    write_reports,
)


def _data(*figs: dict[str, Any]) -> dict[str, Any]:
    machine = {
        "cores": 2,
        "cpu_model": "test cpu",
        "kernel": "6.1",
        "python": "3.11",
        "grpcio": "1",
        "load_start": [0.5, 0.4, 0.3],
        "load_end": [0.6, 0.5, 0.4],
        "busy_pct": 12.0,
    }
    return {
        "schema": SCHEMA,
        "quick": False,
        "started": "now",
        "duration_s": 1.0,
        "machine": machine,
        "figures": list(figs),
        "notes": ["a note"],
    }


def test_nearest_rank_is_always_an_observed_value() -> None:
    values = [float(v) for v in range(1, 101)]
    assert nearest_rank(values, 0.5) == 50.0
    assert nearest_rank(values, 0.95) == 95.0
    assert nearest_rank(values, 0.99) == 99.0
    assert nearest_rank([3.0], 0.99) == 3.0
    assert nearest_rank([1.0, 2.0, 3.0], 0.95) == 3.0


def test_figure_scales_samples_and_evaluates_targets() -> None:
    f = figure(
        "k", "n", "m", "ms", [0.001, 0.002, 0.003], scale=1000.0, targets=[Target("median", 2.5)]
    )
    assert f.samples == 3
    assert f.median == pytest.approx(2.0) and f.max == pytest.approx(3.0)
    assert f.target_met is True
    g = figure("k", "n", "m", "ms", [0.2], scale=1000.0, targets=[Target("p95", 100.0)])
    assert g.target_met is False
    empty = figure("k", "n", "m", "ms", [], targets=[Target("median", 1.0)])
    assert empty.median is None and empty.target_met is False


def test_seed_ratio_follows_the_better_direction() -> None:
    faster = figure("a", "a", "m", "ms", [2.0], seed=5010.0)
    assert faster.seed_ratio == pytest.approx(2505.0)
    more = figure("b", "b", "m", "reads", [68130.0], better="higher", seed=6813.0)
    assert more.seed_ratio == pytest.approx(10.0)
    assert figure("c", "c", "m", "ms", [1.0]).seed_ratio is None


def test_markdown_has_the_table_the_seed_ratio_and_every_miss() -> None:
    ok = figure(
        "cdi",
        "CDI deletion",
        "how",
        "ms",
        [2.0],
        seed=22300.0,
        seed_text="22.3 s",
        targets=[Target("median", 50.0)],
    )
    bad = figure("alloc", "Allocate c16", "how", "ms", [20.0], targets=[Target("p99", 10.0)])
    md = render_markdown(_data(ok.to_json(), bad.to_json()))
    assert "| CDI deletion | 1 | 2.00 |" in md
    assert "11,150x" in md
    assert "median < 50 ms: **met**" in md
    assert "MISSED: Allocate c16: p99 < 10 ms: **MISSED**" in md
    assert "Every stated target was met." not in md
    assert "Every stated target was met." in render_markdown(_data(ok.to_json()))
    assert "load_start" not in md and "[0.5, 0.4, 0.3]" in md


def test_compare_flags_only_regressions_beyond_20_percent() -> None:
    def fig(key: str, value: float, better: Better = "lower") -> dict[str, Any]:
        return figure(key, key, "m", "ms", [value], better=better).to_json()

    old = _data(fig("slow", 10.0), fig("ok", 10.0), fig("rate", 100.0, "higher"), fig("gone", 1.0))
    new = _data(fig("slow", 12.5), fig("ok", 11.9), fig("rate", 79.0, "higher"), fig("new", 1.0))
    rows = {r["key"]: r for r in compare(new, old)}
    assert set(rows) == {"slow", "ok", "rate"}
    assert rows["slow"]["regression"] and rows["slow"]["ratio"] == pytest.approx(1.25)
    assert not rows["ok"]["regression"]
    assert rows["rate"]["regression"]


def test_reports_round_trip_and_bad_compare_files_are_refused(tmp_path: Path) -> None:
    data = _data(figure("x", "x", "m", "ms", [1.0], targets=[Target("max", 2.0, "<=")]).to_json())
    json_path, md_path = write_reports(data, tmp_path / "out")
    assert json.loads(json_path.read_text()) == data
    assert "max <= 2 ms: **met**" in md_path.read_text()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["bench.json", "bench.md"]
    complaints: list[str] = []
    assert load_report(json_path, complaints.append) == data
    other = tmp_path / "other.json"
    other.write_text('{"schema": "something else"}')
    assert load_report(other, complaints.append) is None
    assert load_report(tmp_path / "missing.json", complaints.append) is None
    assert len(complaints) == 2


def test_bench_subcommand_registers_itself() -> None:
    parser = argparse.ArgumentParser(prog="hvconform")
    cli.register(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(["bench", "--quick", "--out", "x", "--compare", "old.json"])
    assert (ns.quick, ns.out, ns.compare, ns.func) == (True, "x", "old.json", cli.runner)
    ns = parser.parse_args(["bench"])
    assert (ns.quick, ns.out, ns.compare) == (False, "reports/bench", "")


def test_summary_says_when_a_figure_has_no_samples() -> None:
    empty = figure("s", "Suite", "m", "s", [])
    empty.notes.append("skipped under --quick")
    assert "no samples (skipped under --quick)" in cli.summary([empty.to_json()])


def test_compare_skips_run_length_figures_and_warns_about_mismatched_runs() -> None:
    counted = figure("reads", "reads", "m", "reads", [1000.0], better="higher", comparable=False)
    old, new = _data(counted.to_json()), _data(counted.to_json())
    assert compare(new, old) == []
    assert compare_warnings(new, old) == []
    new["quick"] = True
    new["machine"] = {**new["machine"], "cores": 8}
    assert compare_warnings(new, old) == [
        "one run is --quick and the other is not: sample counts differ",
        "machines differ in cores",
    ]
