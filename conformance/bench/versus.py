"""--versus: rounds merged into one figure, and the side-by-side table of two plugins.

Each step runs in rounds, the plugins taking turns, so machine drift hits both; a figure's rounds
are merged from their samples. The table puts both medians and p95s side by side, with the ratio
(how many times ours is ahead: theirs/ours where lower is better, ours/theirs where higher is)
and who is ahead. Two medians within EQUAL of each other, or within what the figure's
instrument can resolve, are a tie: a shared machine cannot tell them apart.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any

from hvconform.bench.report import Figure, figure
from hvconform.bench.waits import Plan

EQUAL = 0.05  # medians within 5 % of each other: equal
# CPU time is counted in clock ticks (10 ms): over a 30 s idle round, 0.03 % of a core; a
# difference below the tick resolution of the window is not a measurement.
RESOLUTION = {"% of a core": 0.1, "CPU s/h": 1.2}
NOT_THE_PLUGIN = ("floor", "suite.")


def share(plan: Plan, rounds: int) -> Plan:
    """One round's part of the plan: every sample count divided, warm-ups kept per round."""
    if rounds <= 1:
        return plan

    def part(n: int) -> int:
        return max(1, math.ceil(n / rounds))

    return dataclasses.replace(
        plan,
        cdi_injections=part(plan.cdi_injections),
        restarts=part(plan.restarts),
        plugin_restarts=part(plan.plugin_restarts),
        refusals=part(plan.refusals),
        health_samples=part(plan.health_samples),
        alloc_requests=tuple((c, part(n)) for c, n in plan.alloc_requests),
        alloc_isolated=part(plan.alloc_isolated),
        storm_min_reads=part(plan.storm_min_reads),
        storm_min_cycles=part(plan.storm_min_cycles),
        storm_min_s=plan.storm_min_s / rounds,
        idle_s=plan.idle_s / rounds,
    )


def merge(rounds: Sequence[Figure]) -> Figure:
    """One figure from the same figure's rounds: samples pooled (a count: counts summed)."""
    first = rounds[0]
    if len(rounds) == 1:
        return first
    notes = list(dict.fromkeys(n for f in rounds for n in f.notes))
    notes.append(f"merged from {len(rounds)} rounds, taking turns with the other plugin")
    load: dict[str, float] = {}
    for key in {k for f in rounds for k in f.load}:
        load[key] = statistics.fmean(f.load[key] for f in rounds if key in f.load)
    counts = any(f.samples != len(f.values) for f in rounds)
    values = (
        [sum(v for f in rounds for v in f.values)]
        if counts
        else [v for f in rounds for v in f.values]
    )
    fig = figure(
        first.key,
        first.name,
        first.method,
        first.unit,
        values,
        better=first.better,
        seed=first.seed,
        seed_text=first.seed_text,
        targets=list(first.targets),
        notes=notes,
        load=load,
        comparable=first.comparable,
    )
    if counts:
        fig.samples = sum(f.samples for f in rounds)
    return fig


def _ahead(ours: float, theirs: float, better: str, unit: str) -> tuple[float | None, str]:
    """(how many times ours is ahead, who is ahead: ours, theirs or equal)."""
    if abs(ours - theirs) < RESOLUTION.get(unit, 0.0) or ours == theirs:
        return (1.0 if ours == theirs or min(ours, theirs) > 0 else None), "equal"
    lower_better = better == "lower"
    if min(ours, theirs) <= 0:
        won = (ours < theirs) == lower_better
        return None, "ours" if won else "theirs"
    ratio = theirs / ours if lower_better else ours / theirs
    if abs(ratio - 1.0) <= EQUAL:
        return ratio, "equal"
    return ratio, "ours" if ratio > 1.0 else "theirs"


def side_by_side(
    ours: Sequence[dict[str, Any]], theirs: Sequence[dict[str, Any]], lacks: dict[str, str]
) -> list[dict[str, Any]]:
    """One row per figure of either plugin, in ours' order, theirs-only figures last."""
    by_key = {f["key"]: f for f in theirs}
    keys = [f["key"] for f in ours] + [
        f["key"] for f in theirs if f["key"] not in {g["key"] for g in ours}
    ]
    mine = {f["key"]: f for f in ours}
    rows = []
    for key in keys:
        o, t = mine.get(key), by_key.get(key)
        ref = o or t
        assert ref is not None
        row: dict[str, Any] = {
            "key": key,
            "name": ref["name"],
            "unit": ref["unit"],
            "better": ref["better"],
            "ours": _stats(o),
            "theirs": _stats(t),
            "ratio": None,
            "ahead": "",
            "note": "",
        }
        if any(part in key for part in NOT_THE_PLUGIN):
            row["note"] = "not the plugin's figure (the machine's floor, or the suite's time)"
        elif not ref.get("comparable", True):
            row["note"] = "follows the run's length, not the plugin"
        elif (o is None or o["median"] is None) and (t is None or t["median"] is None):
            row["note"] = "no samples for either plugin (the figure's notes say why)"
        elif o is None or o["median"] is None:
            row["note"] = "ours: not measured"
        elif t is None or t["median"] is None:
            why = next((r for p, r in lacks.items() if key.startswith(p)), "not measured")
            row["note"] = f"theirs: {why}"
        else:
            row["ratio"], row["ahead"] = _ahead(
                o["median"], t["median"], ref["better"], ref["unit"]
            )
        rows.append(row)
    return rows


def _stats(f: dict[str, Any] | None) -> dict[str, Any] | None:
    if f is None:
        return None
    return {"median": f["median"], "p95": f["p95"], "samples": f["samples"]}
