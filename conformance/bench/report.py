"""Figures, targets, the seed's live figures, bench.json / bench.md and `--compare`."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from hvconform.contract import strict_json
from hvconform.contract.safewrite import write_atomic

SCHEMA = "hvconform-bench/1"
REGRESSION = 0.20  # a figure more than 20 % worse than the old run is flagged
# An old median outside this range (besides 0, which compare skips) is not a measurement: a
# ratio against it could overflow.
MEDIAN_RANGE = (1e-9, 1e15)
Better = Literal["lower", "higher"]
Stat = Literal["median", "p95", "p99", "max"]

# The seed's live AKS figures (upstream PR #14 verification, one Standard_D4ads_v5 node).
SEED_CDI_RECOVERY_S = (22.3, 32.2)
SEED_REREGISTRATION_S = 5.01
SEED_ALLOCATION_REPAIR_S = 2.93
SEED_READS = 6813


@dataclass(frozen=True)
class Target:
    """One bound a statistic must stay within, e.g. median < 50 ms."""

    stat: Stat
    limit: float
    op: Literal["<", "<=", ">="] = "<"

    def met(self, value: float | None) -> bool:
        if value is None:
            return False
        if self.op == "<":
            return value < self.limit
        if self.op == "<=":
            return value <= self.limit
        return value >= self.limit

    def text(self, unit: str) -> str:
        return f"{self.stat} {self.op} {self.limit:g} {unit}"


@dataclass
class Figure:
    """One measured figure; values are in `unit`, statistics over `samples` observations."""

    key: str
    name: str
    method: str
    unit: str
    samples: int
    median: float | None
    p95: float | None
    p99: float | None
    max: float | None
    better: Better = "lower"
    seed: float | None = None
    seed_text: str = ""
    targets: list[Target] = field(default_factory=list)
    target_met: bool | None = None
    notes: list[str] = field(default_factory=list)
    load: dict[str, float] = field(default_factory=dict)
    comparable: bool = True  # False: the value follows the run's length, not the plugin
    # The scaled samples themselves, so rounds can be merged (--versus); not written out.
    values: list[float] = field(default_factory=list, repr=False)

    @property
    def seed_ratio(self) -> float | None:
        """How many times ahead of the seed: seed/ours when lower is better, else ours/seed."""
        if self.seed is None or self.median is None or self.median <= 0:
            return None
        return self.seed / self.median if self.better == "lower" else self.median / self.seed

    def evaluate(self) -> None:
        if self.targets:
            self.target_met = all(t.met(getattr(self, t.stat)) for t in self.targets)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("values")
        data["seed_ratio"] = self.seed_ratio
        data["targets"] = [t.text(self.unit) for t in self.targets]
        return data


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The q-quantile by nearest rank: always an observed value, never an interpolation."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def figure(
    key: str,
    name: str,
    method: str,
    unit: str,
    values: Sequence[float],
    *,
    scale: float = 1.0,
    **extra: Any,
) -> Figure:
    """A figure from raw samples (multiplied by `scale`, e.g. 1000 for s -> ms)."""
    scaled = [v * scale for v in values]
    fig = Figure(
        key=key,
        name=name,
        method=method,
        unit=unit,
        samples=len(scaled),
        median=statistics.median(scaled) if scaled else None,
        p95=nearest_rank(scaled, 0.95) if scaled else None,
        p99=nearest_rank(scaled, 0.99) if scaled else None,
        max=max(scaled) if scaled else None,
        values=scaled,
        **extra,
    )
    fig.evaluate()
    return fig


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _verdict(fig: Figure) -> str:
    if not fig.targets:
        return ""
    text = ", ".join(t.text(fig.unit) for t in fig.targets)
    return f"{text}: **{'met' if fig.target_met else 'MISSED'}**"


def render_markdown(data: dict[str, Any]) -> str:
    """bench.md: machine and load, the figure table with the seed ratio, methods, notes."""
    m = data["machine"]
    lines = [
        "# hv-device-plugin benchmarks",
        "",
        f"{'QUICK run (reduced samples, suite skipped). ' if data['quick'] else ''}"
        f"Started {data['started']}, {data['duration_s']:.0f} s.",
        "",
        f"Machine: {m['cores']} cores, {m['cpu_model']}, kernel {m['kernel']}, "
        f"Python {m['python']}, grpcio {m['grpcio']}. Load average (1/5/15 min) at start "
        f"{m['load_start']}, at end {m['load_end']}; CPU busy (all processes) over the run "
        f"{m['busy_pct']:.0f} %. The machine was shared with other test runs: figures are "
        "medians over warmed-up samples, and each figure's own load is in bench.json.",
        "",
        "'x ahead' is the seed's figure divided by ours (for counts and rates: ours divided by"
        " the seed's). The seed's CDI range is compared at its low end, 22.3 s.",
        "",
        "| Figure | Samples | Median | p95 | p99 | Max | Unit | Seed | x ahead | Target |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | --- |",
    ]
    lines += _side_by_side(data)
    figs = [Figure(**_fields(f)) for f in data["figures"]]
    for f in figs:
        ratio = f"{f.seed_ratio:,.0f}x" if f.seed_ratio is not None else ""
        lines.append(
            f"| {f.name} | {f.samples:,} | {_num(f.median)} | {_num(f.p95)} | {_num(f.p99)} "
            f"| {_num(f.max)} | {f.unit} | {f.seed_text} | {ratio} | {_verdict(f)} |"
        )
    missed = [f for f in figs if f.target_met is False]
    lines += ["", "## Targets", ""]
    for f in missed:
        lines.append(f"- MISSED: {f.name}: {_verdict(f)}")
        lines += [f"  - {note}" for note in f.notes]
    if not missed:
        lines.append("Every stated target was met.")
    lines += ["", "## Methods", ""]
    for f in figs:
        lines.append(f"- **{f.name}** (`{f.key}`): {f.method}")
        lines += [f"  - {note}" for note in f.notes]
    if data.get("threads_idle"):
        lines += ["", "## Idle wake-ups per thread", ""]
        lines += ["| Process | Thread | Wake-ups/s | Episodes/s | Period | CPU ms/min |"]
        lines += ["| --- | --- | ---: | ---: | ---: | ---: |"]
        for t in data["threads_idle"]:
            period = f"{t['period_s']:.2f} s" if t.get("period_s") else "-"
            lines.append(
                f"| {t['process']} | {t['comm']} ({t['tid']}) | {t['wakeups_per_s']:.2f} "
                f"| {t['episodes_per_s']:.2f} | {period} | {t['cpu_ms_per_min']:.2f} |"
            )
    if data.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in data["notes"]]
    if data.get("compare"):
        lines += ["", "## Compared with an older run", ""]
        lines += [f"Warning: {w}." for w in data.get("compare_warnings", [])]
        lines.append(
            "A flag asks for a re-run, it proves nothing by itself on a shared machine: read it "
            "with the CPU busy column and with the floor figures measured alongside (a floor "
            "that moved the same way points at the machine, not the plugin)."
        )
        lines += ["", *render_compare(data["compare"])]
    return "\n".join(lines) + "\n"


def _side_by_side(data: dict[str, Any]) -> list[str]:
    """The --versus table: both plugins' medians and p95s, the ratio and who is ahead."""
    rows = data.get("side_by_side")
    if not rows:
        return []
    ours, theirs = data["plugin"]["name"], data["versus"]["plugin"]["name"]
    lines = [
        "",
        f"## Side by side: {ours} (ours) and {theirs} (theirs), taking turns in one run",
        "",
        "Ratio: how many times ours is ahead (theirs/ours where lower is better, ours/theirs "
        "where higher is); medians within 5 % of each other, or closer than the instrument "
        "resolves, are equal. The full figure table below is ours.",
        "",
        f"| Figure | Unit | {ours} median | {ours} p95 | {theirs} median | {theirs} p95 "
        "| Ratio | Ahead | Note |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        o, t = r["ours"] or {}, r["theirs"] or {}
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        lines.append(
            f"| {r['name']} | {r['unit']} | {_num(o.get('median'))} | {_num(o.get('p95'))} "
            f"| {_num(t.get('median'))} | {_num(t.get('p95'))} | {ratio} | {r['ahead'] or '-'} "
            f"| {r['note']} |"
        )
    behind = [r["name"] for r in rows if r["ahead"] == "theirs"]
    lines += ["", f"Ours behind on {len(behind)} figure(s): {', '.join(behind) or 'none'}."]
    mine, rival = data.get("devices"), data["versus"].get("devices")
    if mine is not None and rival is not None:
        lines += ["", f"Device IDs advertised: {ours} {mine}, {theirs} {rival}."]
        if mine != rival:
            lines[-1] += (
                " **Not like for like**: every device list sent (each stream's snapshot, each "
                "health change) differs in size; give both as many IDs (for the go-kvm fixture: "
                "fixtures/plugins/go-kvm/profile-bench.yaml)."
            )
    return [*lines, "", "## Ours", ""]


def _fields(raw: dict[str, Any]) -> dict[str, Any]:
    """A Figure's constructor arguments from its JSON (targets parsed back from their text)."""
    names = Figure.__dataclass_fields__.keys()
    data = {k: v for k, v in raw.items() if k in names}
    unit = str(raw.get("unit", ""))
    data["targets"] = [_parse_target(t, unit) for t in raw.get("targets", [])]
    return data


def _parse_target(text: str, unit: str) -> Target:
    stat, op, limit = text.removesuffix(f" {unit}").split()[:3]
    return Target(stat, float(limit), op)  # type: ignore[arg-type]


def compare(new: dict[str, Any], old: dict[str, Any]) -> list[dict[str, Any]]:
    """Per figure present in both runs: median new/old, flagged when > 20 % worse; each row
    carries both runs' CPU busy share, since a busier machine alone can explain a change."""
    old_by_key = {f["key"]: f for f in old.get("figures", [])}
    rows = []
    for f in new.get("figures", []):
        o = old_by_key.get(f["key"])
        if o is None or not f.get("median") or not o.get("median"):
            continue
        if not f.get("comparable", True):
            continue
        ratio = f["median"] / o["median"]
        worse = ratio > 1 + REGRESSION if f["better"] == "lower" else ratio < 1 - REGRESSION
        rows.append(
            {
                "key": f["key"],
                "name": f["name"],
                "unit": f["unit"],
                "old": o["median"],
                "new": f["median"],
                "ratio": ratio,
                "regression": worse,
                "busy_pct": [o.get("load", {}).get("busy_pct"), f.get("load", {}).get("busy_pct")],
            }
        )
    return rows


def render_compare(rows: Sequence[dict[str, Any]]) -> list[str]:
    out = [
        "| Figure | Old median | New median | New/old | CPU busy old/new | |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        flag = "REGRESSION > 20 %" if r["regression"] else ""
        busy = "/".join("-" if b is None else f"{b:.0f} %" for b in r.get("busy_pct", []))
        out.append(
            f"| {r['name']} | {_num(r['old'])} {r['unit']} | {_num(r['new'])} {r['unit']} "
            f"| {r['ratio']:.2f} | {busy} | {flag} |"
        )
    return out


def compare_warnings(new: dict[str, Any], old: dict[str, Any]) -> list[str]:
    """Why a comparison may mislead: quick against full, another machine."""
    warnings = []
    if new.get("quick") != old.get("quick"):
        warnings.append("one run is --quick and the other is not: sample counts differ")
    for key in ("cores", "cpu_model", "kernel"):
        if new["machine"].get(key) != old["machine"].get(key):
            warnings.append(f"machines differ in {key}")
    return warnings


def write_reports(data: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """bench.json and bench.md in `out`, each written whole (temp file, then rename)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / "bench.json", out / "bench.md")
    texts = (json.dumps(data, indent=2, sort_keys=False) + "\n", render_markdown(data))
    for path, text in zip(paths, texts, strict=True):
        write_atomic(path, text)
    return paths


def load_report(path: Path, complain: Callable[[str], None]) -> dict[str, Any] | None:
    """An older bench.json, or None (after complaining, one line) when it is not one: read
    strictly (a regular UTF-8 file, no NaN, bounded depth), then every field compare() reads
    checked, so a hand-edited or foreign file is refused before the bench spends minutes."""
    try:
        data = strict_json.load(path, label="--compare")
    except strict_json.JsonInputError as exc:
        complain(str(exc))
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        complain(f"--compare {path}: not a {SCHEMA} report")
        return None
    problem = _report_problem(data)
    if problem:
        complain(f"--compare {path}: not a usable {SCHEMA} report: {problem}")
        return None
    return data


def _median_ok(value: object) -> bool:
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return value == 0 or MEDIAN_RANGE[0] <= value <= MEDIAN_RANGE[1]


def _report_problem(data: dict[str, Any]) -> str | None:
    """What compare() and compare_warnings() would trip over in an old report, or None."""
    if not isinstance(data.get("machine"), dict):
        return "'machine' is not an object"
    figures = data.get("figures", [])
    if not isinstance(figures, list):
        return "'figures' is not a list"
    for n, fig in enumerate(figures):
        if not isinstance(fig, dict) or not isinstance(fig.get("key"), str):
            return f"figure {n} has no string 'key'"
        if not _median_ok(fig.get("median")):
            return f"figure {fig['key']!r}: median is not null or a number 0 or {MEDIAN_RANGE}"
        load = fig.get("load", {})
        busy = load.get("busy_pct") if isinstance(load, dict) else "?"
        if busy is not None and (isinstance(busy, bool) or not isinstance(busy, int | float)):
            return f"figure {fig['key']!r}: load.busy_pct is not null or a number"
    return None
