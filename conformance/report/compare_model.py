"""Two runs side by side: each check's verdict in both, each figure with its ratio B/A, and the
change a reviewer must see called out (a regression, a fix, a slower figure, lost coverage).

B is the candidate, A the baseline ("slower", "regression": B against A). Built on the report's
model and wording, so a check reads the same in compare.md as in each run's report.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hvconform.report import words
from hvconform.report.model import (
    MAX_FIGURES_PER_CHECK,
    CheckView,
    ReportView,
    environment_rows,
    figures_left_out,
)

DEFAULT_THRESHOLD = 1.5  # B slower than 1.5 x A ...
DEFAULT_FLOOR_S = 0.005  # ... and by more than 5 ms: noise on a 1 ms figure is not a regression
ABSENT = "absent"
ABSENT_WORD = "Absent"

# Row kinds, gravest first: a row shows the first that applies, and HTML colours by it.
KINDS = ("regression", "slower", "fixed", "lost", "gained", "changed", "same")
KIND_WORDS = {
    "regression": "Regression",
    "slower": "Slower",
    "fixed": "Fixed",
    "lost": "No longer verified",
    "gained": "Now verified",
    "changed": "Changed",
    "same": "Unchanged",
}


def status_word(status: str) -> str:
    return ABSENT_WORD if status == ABSENT else words.STATUS_WORDS.get(status, status)


def verdict_change(a: str, b: str) -> str:
    """The kind of change from A's status to B's (either may be ABSENT)."""
    if a == b:
        return "same"
    if b == "failed":
        return "regression"  # failing in B and not in A: whatever A was, B is worse
    if a == "failed":
        return "fixed" if b == "passed" else "changed"
    if a == "passed":
        return "lost"
    return "gained" if b == "passed" else "changed"


def _number(raw: words.Metric | None) -> float | None:
    if isinstance(raw, int | float) and not isinstance(raw, bool) and math.isfinite(raw):
        return float(raw)
    return None


@dataclass(frozen=True)
class Figure:
    """One metric of one check in both runs. Only durations (names ending in _s) are judged."""

    name: str
    a: words.Metric | None
    b: words.Metric | None
    threshold: float
    floor_s: float

    @property
    def is_duration(self) -> bool:
        return self.name.endswith("_s")

    @property
    def ratio(self) -> float | None:
        a, b = _number(self.a), _number(self.b)
        if a is None or b is None or a <= 0:
            return None
        ratio = b / a
        return ratio if math.isfinite(ratio) else None

    def _beyond(self, slow: float | None, fast: float | None) -> bool:
        if not self.is_duration or slow is None or fast is None or min(slow, fast) < 0:
            return False
        return slow > fast * self.threshold and slow - fast > self.floor_s

    @property
    def slower(self) -> bool:
        return self._beyond(_number(self.b), _number(self.a))

    @property
    def faster(self) -> bool:
        return self._beyond(_number(self.a), _number(self.b))

    @property
    def note(self) -> str:
        if self.a is None:
            return "only in B"
        if self.b is None:
            return "only in A"
        if self.slower:
            return "slower"
        if self.faster:
            return "faster"
        if _number(self.a) is None and self.a != self.b:
            return "differs"
        return ""

    @property
    def a_text(self) -> str:
        return "—" if self.a is None else words.value(self.name, self.a)

    @property
    def b_text(self) -> str:
        return "—" if self.b is None else words.value(self.name, self.b)

    @property
    def ratio_text(self) -> str:
        ratio = self.ratio
        return "—" if ratio is None else f"{ratio:.2f}x"


@dataclass
class Row:
    """One check id, as both runs saw it (None: the run has no record of it)."""

    id: str
    a: CheckView | None
    b: CheckView | None
    figures: list[Figure] = field(default_factory=list)
    hidden: int = 0  # figures of this check not shown (the caps above)
    absent_why: tuple[str, str] = ("", "")  # why a run has no record of it, if known

    @property
    def title(self) -> str:
        return next((c.label for c in (self.a, self.b) if c is not None and c.label), "")

    @property
    def status_a(self) -> str:
        return ABSENT if self.a is None else self.a.status

    @property
    def status_b(self) -> str:
        return ABSENT if self.b is None else self.b.status

    @property
    def change(self) -> str:
        return verdict_change(self.status_a, self.status_b)

    @property
    def slower(self) -> list[Figure]:
        return [f for f in self.figures if f.slower]

    @property
    def kind(self) -> str:
        if self.change == "same" and self.slower:
            return "slower"
        return self.change

    @property
    def transition(self) -> str:
        """'Passed → FAILED'; the single word when nothing changed."""
        a, b = status_word(self.status_a), status_word(self.status_b)
        return a if a == b else f"{a} → {b}"

    @property
    def callout(self) -> str:
        """The change in one phrase: the verdicts, then every slower figure with its ratio."""
        parts = [] if self.change == "same" else [self.transition]
        parts += [f"{f.name} {f.a_text} → {f.b_text} ({f.ratio_text})" for f in self.slower]
        return "; ".join(parts)

    @property
    def why_b(self) -> str:
        """Why B's verdict is what it is, when B has one and it is not a pass."""
        return self.reason("b") if self.b is not None else ""

    def reason(self, side: str) -> str:
        """Why a run's verdict is not a pass, in words ("" for a pass)."""
        view = self.a if side == "a" else self.b
        if view is None:
            why = self.absent_why[0 if side == "a" else 1]
            return why or "this run has no record of the check"
        if view.status == "passed" or not view.reason:
            return ""
        return view.reason_words.rstrip(".")

    def cell(self, side: str) -> str:
        """A results-table cell: the status word, and the reason when it is not a pass."""
        word = status_word(self.status_a if side == "a" else self.status_b)
        why = self.reason(side)
        return f"{word}: {why}." if why else f"{word}."


@dataclass(frozen=True)
class Side:
    """One run: its label, its report view and where its files are, relative to the report."""

    label: str
    view: ReportView
    results_href: str
    report_href: str  # "" when the run has no report.html next to its results

    @property
    def run(self) -> dict[str, Any]:
        return self.view.run

    @property
    def runtime(self) -> str:
        """How the target ran the plugin (process, container), when the run records it."""
        return str(self.run.get("runtime") or "—")

    @property
    def selection(self) -> str:
        """Which checks were selected: a run of fewer checks leaves the others absent."""
        markexpr = str(self.run.get("markexpr") or "")
        return f"-m {markexpr}" if markexpr else "all"


@dataclass
class CompareView:
    a: Side
    b: Side
    rows: list[Row]
    environment: list[tuple[str, str, str]]  # label, A's value, B's value
    threshold: float
    floor_s: float

    @property
    def title(self) -> str:
        return f"hvconform compare: {self.a.label} vs {self.b.label}"

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.change == "regression"]

    @property
    def slower(self) -> list[Figure]:
        return [f for r in self.rows for f in r.slower]

    @property
    def regressed(self) -> bool:
        return bool(self.regressions or self.slower)

    @property
    def changes(self) -> list[Row]:
        """Rows to call out, gravest first, catalogue order within a kind."""
        return sorted((r for r in self.rows if r.kind != "same"), key=lambda r: KINDS.index(r.kind))

    @property
    def verdict_text(self) -> str:
        if not self.regressed:
            return "NO REGRESSION"
        parts = []
        if self.regressions:
            parts.append(
                words.plural(len(self.regressions), "check newly failed", "checks newly failed")
            )
        if self.slower:
            parts.append(words.plural(len(self.slower), "figure slower", "figures slower"))
        return "REGRESSION: " + ", ".join(parts)

    @property
    def summary(self) -> str:
        kinds = [r.kind for r in self.rows]
        found = [(KIND_WORDS[k].lower(), kinds.count(k)) for k in KINDS if kinds.count(k)]
        parts = ", ".join(f"{n} {w}" for w, n in found)
        figures = sum(len(r.figures) for r in self.rows)
        total = words.plural(len(self.rows), "check", "checks")
        return f"{total} compared: {parts}; {words.plural(figures, 'figure', 'figures')}."

    @property
    def rule(self) -> str:
        """The threshold in words, as both reports state it."""
        return (
            f"A duration in B is slower when it exceeds {self.threshold:g}x A's and by more"
            f" than {words.duration(self.floor_s)}"
        )

    @property
    def figure_rows(self) -> list[tuple[Row, Figure]]:
        return [(r, f) for r in self.rows for f in r.figures]

    @property
    def hidden_figures(self) -> str:
        """What the caps left out, said in the report ('' when nothing was)."""
        return figures_left_out(sum(r.hidden for r in self.rows))


def merged_ids(a: list[str], b: list[str]) -> list[str]:
    """Union of both id lists in catalogue order (reporting may not import the catalogue; both
    runs record their checks in it): A's order, each id only B has after the id it follows in B.
    Linear: B's extra ids are attached to their anchor, then everything is laid out once."""
    order = list(dict.fromkeys(a))
    known = set(order)
    after: dict[str | None, list[str]] = {}
    anchor: str | None = None
    for check_id in dict.fromkeys(b):
        if check_id in known:
            anchor = check_id
        else:
            after.setdefault(anchor, []).append(check_id)
    out = list(after.get(None, []))
    for check_id in order:
        out.append(check_id)
        out += after.get(check_id, [])
    return out


# The comparison's cost is bounded and stated with the report's caps (model.MAX_FIGURES_PER_CHECK
# and MAX_FIGURES, one definition for both); work is linear in the input.


def figures(
    a: CheckView | None,
    b: CheckView | None,
    threshold: float,
    floor_s: float,
    budget: int = MAX_FIGURES_PER_CHECK,
) -> tuple[list[Figure], int]:
    """The figures of one check in the order the checks recorded them; at most `budget` of
    them, and how many were left out."""
    ma = a.metrics if a is not None else {}
    mb = b.metrics if b is not None else {}
    names = list(dict.fromkeys([*ma, *mb]))
    shown = names[: max(0, min(budget, MAX_FIGURES_PER_CHECK))]
    return [Figure(n, ma.get(n), mb.get(n), threshold, floor_s) for n in shown], len(names) - len(
        shown
    )


def _profile(data: dict[str, Any]) -> dict[str, Any]:
    """The plugin under test as results record it; tolerant of where and how (being added now)."""
    run, env = data.get("run", {}), data.get("environment", {})
    for holder in (run, env):
        for key in ("plugin", "plugin_profile", "profile"):
            found = holder.get(key) if isinstance(holder, dict) else None
            if isinstance(found, dict):
                return found
            if isinstance(found, str) and found:
                return {"name": found}
    return {}


def profile_name(data: dict[str, Any]) -> str:
    name = _profile(data).get("name")
    return name if isinstance(name, str) else ""


_PROFILE_LABELS = {
    "name": "Plugin profile",
    "source": "Profile source",
    "command": "Plugin command",
    "readiness": "Readiness",
    "liveness": "Liveness",
    "resource": "Resource",
    "cdi_kind": "CDI kind",
    "image": "Plugin image",
    "this_repository": "This repository's plugin",
}


def _flat(value: Any) -> str:
    if isinstance(value, dict):
        if "type" in value:  # a probe: its kind says enough beside the other run's
            return str(value["type"])
        return ", ".join(f"{k} {_flat(v)}" for k, v in value.items() if v not in (None, "", []))
    if isinstance(value, list):
        return ", ".join(_flat(v) for v in value)
    return str(value)


def environment_of(data: dict[str, Any]) -> list[tuple[str, str]]:
    """The report's environment rows, with the plugin profile's facts first."""
    rows = [
        (_PROFILE_LABELS.get(str(k), str(k).replace("_", " ").capitalize()), _flat(v))
        for k, v in _profile(data).items()
        if v not in (None, "", [], {})
    ]
    return rows + environment_rows(dict(data.get("environment", {})), dict(data.get("run", {})))


def side_by_side(a: list[tuple[str, str]], b: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """One row per label, in the merged order of both; repeated labels (images) joined."""
    values: dict[str, tuple[list[str], list[str]]] = {}
    for which, rows in ((0, a), (1, b)):
        for label, value in rows:
            held = values.setdefault(label, ([], []))[which]
            if value not in held:
                held.append(value)
    order = merged_ids([label for label, _ in a], [label for label, _ in b])
    return [(k, "; ".join(values[k][0]) or "—", "; ".join(values[k][1]) or "—") for k in order]
