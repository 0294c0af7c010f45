"""The pool's results merged: every node named, each check's status per node, each figure's
distribution, the environment facts that differ, and what the pool's verdict rests on.

Each results document (found and read by hvconform.fleet.sources) is viewed through
hvconform.report.model, the view `hvconform report` renders, so a node's statuses, planned
checks that never ran and partial runs mean here what they mean in its own report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hvconform.contract import strict_json
from hvconform.fleet import stats
from hvconform.fleet.sources import FleetError, Found, find
from hvconform.report import text
from hvconform.report.model import MAX_FIGURES, NOT_RUN, CheckView, ReportView, build

MAX_NAME = 253  # a Kubernetes node name's longest
ABSENT = "absent"  # the node has no record of a check another node has
# What a pool verdict makes of a node's check status (passed and failed aside).
UNFINISHED = frozenset({"blocked", "environment_blocked", NOT_RUN, ABSENT})
NOT_VERIFIED = frozenset({"not_applicable", "skipped"})
UNRECORDED = "(not recorded)"


def node_of(found: Found) -> tuple[str, str]:
    """(node name, where the name was read): the results' own environment first (a cluster
    target records the node it ran on as environment.cluster.node), then the Sonobuoy node
    directory, then the host name of a run on the machine itself."""
    env = found.data.get("environment") or {}
    cluster, node = env.get("cluster"), env.get("node")
    candidates = [
        (cluster.get("node") if isinstance(cluster, dict) else None, "environment.cluster.node"),
        (node.get("name") if isinstance(node, dict) else node, "environment.node"),
        (found.sonobuoy_node, "the Sonobuoy node directory (the results name no node)"),
        (env.get("hostname"), "environment.hostname (the results name no node)"),
    ]
    for name, where in candidates:
        if isinstance(name, str) and name.strip():
            shown = strict_json.one_line(text.visible(name.strip()), MAX_NAME + 1)
            if len(shown) > MAX_NAME:
                raise FleetError(f"{found.source}: node name longer than {MAX_NAME} characters")
            return shown, where
    raise FleetError(f"{found.source}: names no node (no environment.cluster.node or hostname)")


def _join(*values: Any) -> str:
    return " ".join(str(v) for v in values if v not in (None, ""))


def _obj(value: Any) -> dict[str, Any]:
    """value when it is a JSON object, else an empty one (a fact not recorded)."""
    return value if isinstance(value, dict) else {}


def environment_facts(env: dict[str, Any]) -> dict[str, str]:
    """The facts compared across nodes: the node's own (a cluster target's environment.cluster)
    before the suite host's, then each hypervisor device's metadata as recorded."""
    cluster, node, runtime = (
        _obj(env.get("cluster")),
        _obj(env.get("node")),
        _obj(env.get("runtime")),
    )
    found = env.get("container_runtime")
    runtimes = [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []
    kubelet = _obj(_obj(env.get("components")).get("kubelet"))
    asked = next((_join(r.get("name"), r.get("version")) for r in runtimes if r.get("name")), "")
    containerd = node.get("containerd_version")
    facts = {
        "kernel": cluster.get("kernel") or env.get("kernel"),
        "container_runtime": cluster.get("container_runtime")
        or asked
        or (f"containerd {containerd}" if containerd else "")
        or _join(runtime.get("name"), runtime.get("version")),
        "kubelet": cluster.get("kubelet")
        or node.get("kubernetes_version")
        or kubelet.get("version"),
        "os_image": cluster.get("os_image") or node.get("os_image") or env.get("distribution"),
    }
    out = {k: str(v).strip() if v else UNRECORDED for k, v in facts.items()}
    for path, info in sorted(_obj(env.get("devices")).items()):
        if not isinstance(info, dict) or not info.get("present"):
            out[f"device {path}"] = "absent"
            continue
        for key in ("mode", "uid", "gid", "major", "minor"):
            out[f"device {path} {key}"] = str(info.get(key, UNRECORDED))
    return out


@dataclass
class NodeResult:
    name: str
    named_by: str
    source: str
    view: ReportView
    order: list[str]  # check ids in the results' own order, then planned ones not run
    environment: dict[str, str]
    _by_id: dict[str, CheckView] = field(default_factory=dict, repr=False)

    @property
    def verdict(self) -> str:
        return self.view.verdict

    def check(self, check_id: str) -> CheckView | None:
        if len(self._by_id) != len(self.view.checks):
            self._by_id = {c.id: c for c in self.view.checks}
        return self._by_id.get(check_id)

    def status(self, check_id: str) -> str:
        found = self.check(check_id)
        return found.status if found is not None else ABSENT


@dataclass(frozen=True)
class Finding:
    node: str
    check: str  # "" for the node as a whole (a partial run, a missing node)
    status: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {
            "node": self.node,
            "check": self.check,
            "status": self.status,
            "reason": self.reason,
        }

    @property
    def line(self) -> str:
        what = f"{self.node}: {self.check} {self.status}" if self.check else self.node
        return f"{what}: {self.reason}" if self.reason else what


@dataclass
class CheckRow:
    id: str
    title: str
    requirement_level: str
    statuses: dict[str, str]  # node -> status, in node order


@dataclass
class Fleet:
    nodes: list[NodeResult]
    checks: list[CheckRow]
    figures: list[stats.Distribution]
    env_differences: dict[str, dict[str, list[str]]]  # field -> value -> nodes
    failures: list[Finding] = field(default_factory=list)
    unfinished: list[Finding] = field(default_factory=list)
    not_verified: list[Finding] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    expected_count: int | None = None
    expected_names: tuple[str, ...] = ()
    figures_left_out: int = 0

    @property
    def verdict(self) -> str:
        """failed beats incomplete beats passed; not applicable and skipped never pass."""
        if self.failures:
            return "failed"
        return "incomplete" if self.unfinished else "passed"

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]


def load(paths: Sequence[Path], out_dir: Path) -> list[NodeResult]:
    """Every node's results, named and in name order; two results of one node are refused."""
    nodes: dict[str, NodeResult] = {}
    for found in find(paths):
        name, named_by = node_of(found)
        if name in nodes:
            raise FleetError(
                f"two results for node {name}: {nodes[name].source} and {found.source}"
            )
        run_dir = found.run_dir or out_dir / ".in-tarball"  # no evidence is looked up there
        view = build(found.data, run_dir, out_dir)
        # The results' own order (the catalogue's), then the planned checks that never ran.
        ran = [str(c["id"]) for c in found.data["checks"]]
        order = list(dict.fromkeys([*ran, *(c.id for c in view.checks)]))
        env = text.visible_tree(found.data.get("environment") or {})
        nodes[name] = NodeResult(name, named_by, found.source, view, order, environment_facts(env))
    return [nodes[n] for n in sorted(nodes)]


def _numeric(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _figures(nodes: list[NodeResult], check_ids: list[str]) -> tuple[list[stats.Distribution], int]:
    found: list[stats.Distribution] = []
    left_out = 0
    for check_id in check_ids:
        per_metric: dict[str, dict[str, float]] = {}
        for node in nodes:
            view = node.check(check_id)
            for name, value in (view.metrics if view is not None else {}).items():
                number = _numeric(value)
                if number is not None:
                    per_metric.setdefault(name, {})[node.name] = number
        for name, values in per_metric.items():
            if len(found) >= MAX_FIGURES:
                left_out += 1
                continue
            found.append(stats.distribution(check_id, name, values))
    return found, left_out


def _differences(nodes: list[NodeResult]) -> dict[str, dict[str, list[str]]]:
    fields = list(dict.fromkeys(k for n in nodes for k in n.environment))
    out: dict[str, dict[str, list[str]]] = {}
    for name in fields:
        by_value: dict[str, list[str]] = {}
        for node in nodes:
            by_value.setdefault(node.environment.get(name, UNRECORDED), []).append(node.name)
        if len(by_value) > 1:
            out[name] = by_value
    return out


def merge(
    nodes: list[NodeResult], *, expect_count: int | None = None, expect_names: Sequence[str] = ()
) -> Fleet:
    """The pool: each check's status on each node, each figure's distribution, the facts that
    differ, and what the verdict rests on."""
    check_ids = list(dict.fromkeys(i for n in nodes for i in n.order))
    rows: list[CheckRow] = []
    fleet = Fleet(nodes, rows, [], _differences(nodes), expected_count=expect_count)
    fleet.expected_names = tuple(expect_names)
    for check_id in check_ids:
        views = [v for n in nodes if (v := n.check(check_id)) is not None]
        title = next((v.title for v in views if v.title != check_id), check_id)
        level = next((v.requirement_level for v in views if v.requirement_level), "")
        rows.append(CheckRow(check_id, title, level, {n.name: n.status(check_id) for n in nodes}))
        for node in nodes:
            view = node.check(check_id)
            status = view.status if view is not None else ABSENT
            reason = view.reason_words if view is not None else "no record of this check"
            finding = Finding(node.name, check_id, status, strict_json.one_line(reason))
            if status == "failed":
                fleet.failures.append(finding)
            elif status in UNFINISHED:
                fleet.unfinished.append(finding)
            elif status in NOT_VERIFIED:
                fleet.not_verified.append(finding)
    for node in nodes:
        run = node.view.run
        if node.view.partial:
            why = strict_json.one_line(str(run.get("interruption") or "the run stopped early"))
            fleet.unfinished.append(Finding(node.name, "", "partial", f"partial run: {why}"))
        if not any(c.status == "passed" for c in node.view.checks):
            fleet.unfinished.append(Finding(node.name, "", "unverified", "no check passed"))
    fleet.figures, fleet.figures_left_out = _figures(nodes, check_ids)
    names = set(fleet.names)
    if expect_names:
        fleet.missing = [n for n in expect_names if n not in names]
        fleet.unexpected = [n for n in fleet.names if n not in set(expect_names)]
    for name in fleet.missing:
        fleet.unfinished.append(Finding(name, "", "missing", "expected, but no results found"))
    if expect_count is not None and len(nodes) < expect_count:
        short = f"expected {expect_count} nodes, found {len(nodes)}"
        fleet.unfinished.append(Finding("(pool)", "", "missing", short))
    return fleet
