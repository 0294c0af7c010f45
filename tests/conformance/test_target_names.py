"""Only the targets know their names (issue 37): outside `conformance/targets/`, code acts on a
target's traits (hvconform.targets.Target: serial, host_metadata, pool, cluster, runtimes)
or on its typed options, never on `target == "kind"`. An AST scan of every module: a comparison
of something named like a target with a target's name (or a tuple of them) is a finding. What
is still left to move is listed, each with its place in the redesign; the list may only shrink
(a stale entry fails too)."""

from __future__ import annotations

import ast
from pathlib import Path

from hvconform.targets import TARGETS

ROOT = Path(__file__).resolve().parents[2] / "conformance"
NAMES = set(TARGETS)

# path -> number of comparisons left there, and why they are still there.
LEFT: dict[str, int] = {}


def _names_target(node: ast.expr) -> bool:
    text = ast.unparse(node)
    return "target" in text.lower()


def _is_target_literal(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(isinstance(e, ast.Constant) and e.value in NAMES for e in node.elts)
    return False


def findings() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("targets/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            if any(_is_target_literal(s) for s in sides) and any(_names_target(s) for s in sides):
                found.setdefault(rel, []).append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_target_name_compared_outside_targets() -> None:
    found = findings()
    new = {p: f for p, f in found.items() if p not in LEFT}
    assert not new, f"compare a target's trait, not its name: {new}"
    for path, count in LEFT.items():
        got = found.get(path, [])
        assert len(got) <= count, f"{path}: more than the {count} left: {got}"
        assert got, f"{path}: none left: remove it from LEFT"


def test_the_scan_finds_a_comparison() -> None:
    tree = ast.parse('if ns.target == "kind":\n    pass\nif target in ("local", "node"): pass')
    hits = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)]
    assert all(
        _is_target_literal(c) or _is_target_literal(n.left) for n in hits for c in n.comparators
    )
    assert len(hits) == 2


def test_every_target_says_who_runs_the_host_metadata_check() -> None:
    assert {t.host_metadata for t in TARGETS.values()} <= {"suite", "target", "none"}
    # the device of an AKS node is not on this machine; kind's lifecycle takes its kvm group
    assert TARGETS["aks"].host_metadata == "none" and TARGETS["kind"].host_metadata == "target"
    assert [n for n, t in TARGETS.items() if t.host_metadata == "suite"] == ["local", "node"]
