"""A figure's distribution across a pool's nodes, and the nodes whose value stands out.

The rule, stated once (README "Fleet report" and fleet.json's `outlier_rule` repeat it):

- median: the middle value (the mean of the two middle values for an even count);
- p95: nearest rank, the value at rank ceil(0.95 * n) of the sorted values (never interpolated:
  it is always a value some node measured);
- spread: the median absolute deviation (MAD) scaled by 1.4826 (so that it estimates a standard
  deviation for normal data), floored at 5% of |median| and at MIN_SPREAD, so a figure every
  node measured identically (MAD 0) does not make the slightest difference an outlier;
- outlier: a node whose value is more than OUTLIER_K spreads from the median, and only among at
  least MIN_NODES values (with two, neither is more typical than the other).

The median and MAD are robust: one node ten times slower does not move them, so it cannot hide
itself by widening the band as it would with a mean and standard deviation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

OUTLIER_K = 3.0
MAD_SCALE = 1.4826
RELATIVE_FLOOR = 0.05
MIN_SPREAD = 1e-6
MIN_NODES = 3
RULE = (
    f"outlier: |value - median| > {OUTLIER_K:g} x spread, spread = max({MAD_SCALE} x MAD, "
    f"{RELATIVE_FLOOR:g} x |median|, {MIN_SPREAD:g}), MAD = median(|value - median|); "
    f"judged among {MIN_NODES} or more nodes; p95 by nearest rank"
)


@dataclass(frozen=True)
class Distribution:
    """One figure of one check across the nodes that recorded it (values by node name)."""

    check: str
    name: str
    values: dict[str, float]
    minimum: float
    median: float
    p95: float
    maximum: float
    spread: float
    outliers: dict[str, float]  # node -> its value, in node order

    @property
    def count(self) -> int:
        return len(self.values)

    def to_json(self) -> dict[str, object]:
        return {
            "check": self.check,
            "name": self.name,
            "count": self.count,
            "min": self.minimum,
            "median": self.median,
            "p95": self.p95,
            "max": self.maximum,
            "spread": self.spread,
            "outliers": [{"node": n, "value": v} for n, v in self.outliers.items()],
            "values": dict(self.values),
        }


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median of no values")
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def nearest_rank(values: list[float], percent: float) -> float:
    """The value at rank ceil(percent/100 * n) of the sorted values (rank 1 at least)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    rank = max(1, math.ceil(percent / 100 * len(ordered)))
    return ordered[rank - 1]


def spread(values: list[float], centre: float) -> float:
    mad = median([abs(v - centre) for v in values])
    return max(MAD_SCALE * mad, RELATIVE_FLOOR * abs(centre), MIN_SPREAD)


def outliers(values: Mapping[str, float]) -> dict[str, float]:
    """The nodes whose value is more than OUTLIER_K spreads from the median (module rule)."""
    if len(values) < MIN_NODES:
        return {}
    numbers = list(values.values())
    centre = median(numbers)
    width = OUTLIER_K * spread(numbers, centre)
    return {node: v for node, v in values.items() if abs(v - centre) > width}


def distribution(check: str, name: str, values: Mapping[str, float]) -> Distribution:
    """The distribution of one figure; values (node -> value) must not be empty."""
    numbers = list(values.values())
    centre = median(numbers)
    return Distribution(
        check=check,
        name=name,
        values=dict(values),
        minimum=min(numbers),
        median=centre,
        p95=nearest_rank(numbers, 95),
        maximum=max(numbers),
        spread=spread(numbers, centre),
        outliers=outliers(values),
    )
