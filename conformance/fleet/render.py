"""The pool report in three forms, all from one Fleet: fleet.json, fleet.txt and fleet.html.

fleet.json (schema "hvconform-fleet", version FLEET_SCHEMA_VERSION; a reader refuses a major
version it does not know, and new optional keys raise the minor one):

    schema, schema_version     "hvconform-fleet", "1.0"
    verdict                    "passed", "failed" or "incomplete" (the pool's)
    verdict_reasons            one line each: every failure, then what left the pool incomplete
    nodes[]                    name, named_by (where the name was read), source (the file, or
                               TARBALL!MEMBER), run_id, target, verdict (the node's own report
                               verdict), environment {field: value} (the compared facts)
    expected                   count (--expect-nodes or null), names (--nodes), missing,
                               unexpected (found but not named)
    checks[]                   id, title, requirement_level, statuses {node: status}; a status
                               is the results' own, "not_run" (planned, never ran) or "absent"
    failures[], incomplete[], not_verified[]
                               {node, check, status, reason}; check "" for the node as a whole
                               (a partial run, a node that passed nothing, a missing node)
    figures[]                  check, name, count, min, median, p95, max, spread,
                               outliers [{node, value}], values {node: value}
    figures_left_out           distributions over hvconform.report.model.MAX_FIGURES, not listed
    outlier_rule               the rule in words (hvconform.fleet.stats)
    environment_differences[]  field, values [{value, nodes}]: only the fields that differ
"""

from __future__ import annotations

import json
from typing import Any

import jinja2

from hvconform.fleet import stats
from hvconform.fleet.model import Fleet
from hvconform.report.render import environment
from hvconform.report.words import STATUS_WORDS

FLEET_SCHEMA = "hvconform-fleet"
FLEET_SCHEMA_VERSION = "1.0"
STATUS_WORDS_FLEET = {**STATUS_WORDS, "absent": "Absent", "not_run": "Not run"}


def reasons(fleet: Fleet) -> list[str]:
    """The lines the verdict rests on: failures first, then what is unfinished."""
    return [f.line for f in (*fleet.failures, *fleet.unfinished)]


def to_json(fleet: Fleet) -> dict[str, Any]:
    return {
        "schema": FLEET_SCHEMA,
        "schema_version": FLEET_SCHEMA_VERSION,
        "verdict": fleet.verdict,
        "verdict_reasons": reasons(fleet),
        "nodes": [
            {
                "name": n.name,
                "named_by": n.named_by,
                "source": n.source,
                "run_id": str(n.view.run.get("id", "")),
                "target": n.view.target,
                "verdict": n.verdict,
                "environment": dict(n.environment),
            }
            for n in fleet.nodes
        ],
        "expected": {
            "count": fleet.expected_count,
            "names": list(fleet.expected_names),
            "missing": list(fleet.missing),
            "unexpected": list(fleet.unexpected),
        },
        "checks": [
            {
                "id": c.id,
                "title": c.title,
                "requirement_level": c.requirement_level,
                "statuses": dict(c.statuses),
            }
            for c in fleet.checks
        ],
        "failures": [f.to_json() for f in fleet.failures],
        "incomplete": [f.to_json() for f in fleet.unfinished],
        "not_verified": [f.to_json() for f in fleet.not_verified],
        "figures": [d.to_json() for d in fleet.figures],
        "figures_left_out": fleet.figures_left_out,
        "outlier_rule": stats.RULE,
        "environment_differences": [
            {"field": name, "values": [{"value": v, "nodes": ns} for v, ns in values.items()]}
            for name, values in fleet.env_differences.items()
        ],
    }


def render_json(fleet: Fleet) -> str:
    return json.dumps(to_json(fleet), indent=2) + "\n"


def number(value: float) -> str:
    """A figure as measured: integers without a point, others to 6 significant digits."""
    return str(int(value)) if value == int(value) and abs(value) < 1e15 else f"{value:.6g}"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def render_text(fleet: Fleet) -> str:
    """fleet.txt: the verdict and its reasons, the status grid, figures, environment."""
    out = [f"Pool verdict: {fleet.verdict.upper()} ({len(fleet.nodes)} nodes)"]
    out += [f"  {line}" for line in reasons(fleet)]
    out += ["", "Nodes:"]
    out += [f"  {n.name}: {n.verdict} ({n.source}; name from {n.named_by})" for n in fleet.nodes]
    if fleet.missing or fleet.unexpected:
        out.append(f"  missing: {', '.join(fleet.missing) or 'none'}")
        out.append(f"  not expected: {', '.join(fleet.unexpected) or 'none'}")
    out += ["", "Checks (status per node):"]
    grid = [["check", *fleet.names]]
    grid += [[c.id, *(c.statuses[n] for n in fleet.names)] for c in fleet.checks]
    out += [f"  {line}" for line in _table(grid)]
    if fleet.not_verified:
        out += ["", "Not verified (never counted as passed):"]
        out += [f"  {f.line}" for f in fleet.not_verified]
    out += ["", "Figures across nodes:", f"  {stats.RULE}"]
    rows = [["check", "figure", "n", "min", "median", "p95", "max", "outliers"]]
    for d in fleet.figures:
        named = ", ".join(f"{n}={number(v)}" for n, v in d.outliers.items()) or "-"
        shape = (d.minimum, d.median, d.p95, d.maximum)
        rows.append([d.check, d.name, str(d.count), *(number(v) for v in shape), named])
    out += [f"  {line}" for line in _table(rows)] if fleet.figures else ["  none recorded"]
    if fleet.figures_left_out:
        out.append(f"  {fleet.figures_left_out} more figures in no table (the cap)")
    out += ["", "Environment differences:"]
    for name, values in fleet.env_differences.items():
        shown = "; ".join(f"{v}: {', '.join(ns)}" for v, ns in values.items())
        out.append(f"  {name}: {shown}")
    if not fleet.env_differences:
        out.append("  none: every compared fact is the same on every node")
    return "\n".join(out) + "\n"


def _template() -> jinja2.Template:
    """The report's own environment (its filters, autoescape, StrictUndefined), reading this
    package's templates first so fleet.html can include report.css as report.html does."""
    env = environment()
    env.loader = jinja2.ChoiceLoader(
        [jinja2.PackageLoader("hvconform.fleet", "templates"), env.loader or jinja2.BaseLoader()]
    )
    env.filters.update(number=number, statusword=lambda s: STATUS_WORDS_FLEET.get(s, s))
    return env.get_template("fleet.html.j2")


def render_html(fleet: Fleet) -> str:
    return str(_template().render(f=fleet, reasons=reasons(fleet), rule=stats.RULE))
