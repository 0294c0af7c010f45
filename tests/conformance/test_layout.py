"""Layout rules a grep can check: each fact defined once, the README's check table generated.

import-linter holds the import arrows (pyproject.toml); these tests hold what it cannot see.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from hvconform.scenarios import readme_table

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    p for d in ("plugin", "conformance") for p in (ROOT / d).rglob("*.py") if "_pb2" not in p.name
)
# Each fact, as a string literal, may appear in exactly one module: where it is defined. The
# same word as two facts names both modules: "Unhealthy" is a device's health (wire.py) and the
# kubelet's event reason for a failed probe (plugin_pod.py), defined once each.
ONCE: dict[str, str | tuple[str, ...]] = {
    '"hyperlight.dev/hypervisor"': "plugin/api/names.py",
    '"hyperlight.dev/device-access"': "plugin/api/names.py",
    '"hyperlight.json"': "plugin/api/names.py",
    '"v1beta1"': "plugin/api/wire.py",
    '"kubelet.sock"': "plugin/api/wire.py",
    '"Healthy"': "plugin/api/wire.py",
    '"Unhealthy"': ("plugin/api/wire.py", "conformance/targets/cluster/plugin_pod.py"),
    '"/var/lib/kubelet/device-plugins"': "plugin/api/wire.py",
}


def _literal_sites(literal: str) -> list[str]:
    value = ast.literal_eval(literal)
    sites = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value == value:
                sites.append(str(path.relative_to(ROOT)))
                break
    return sites


@pytest.mark.parametrize("literal", sorted(ONCE))
def test_each_fact_is_defined_exactly_once(literal: str) -> None:
    where = ONCE[literal]
    assert sorted(_literal_sites(literal)) == sorted([where] if isinstance(where, str) else where)


def test_targets_and_runtimes_are_listed_once() -> None:
    # The registry is the only list of target names; the CLI and the pytest plugin import it.
    pattern = re.compile(r"\(\s*\"local\",\s*\"kind\"|\(\"process\",\s*\"container\"\)")
    hits = [str(p.relative_to(ROOT)) for p in SOURCES if pattern.search(p.read_text())]
    assert hits == ["conformance/targets/__init__.py"], hits


def test_the_target_registry_imports_only_the_standard_library() -> None:
    tree = ast.parse((ROOT / "conformance" / "targets" / "__init__.py").read_text())
    modules = {
        (n.module or "").split(".")[0] if isinstance(n, ast.ImportFrom) else a.name.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in (n.names if isinstance(n, ast.Import) else [n])  # type: ignore[list-item]
    }
    assert modules <= set(sys.stdlib_module_names) | {"__future__"}, modules


def test_readme_check_table_is_generated_from_the_catalogue() -> None:
    readme = (ROOT / "README.md").read_text()
    hint = "regenerate it from hvconform.scenarios.readme_table()"
    assert readme_table() in readme, hint


def _absolute_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def test_nothing_imports_a_folder_name() -> None:
    # The folders plugin/ and conformance/ install as hv_device_plugin and hvconform (issue 36:
    # generic top-level names collide with other distributions). From a checkout on sys.path a
    # folder's name would still import, as a second copy of every module, so it never may.
    files = [
        *SOURCES,
        *sorted((ROOT / "tests").rglob("*.py")),
        *sorted((ROOT / "tools").glob("*.py")),
    ]
    old = {"plugin", "conformance"}
    hits = [
        f"{p.relative_to(ROOT)}:{line}: {name}"
        for p in files
        for line, name in _absolute_imports(p)
        if name.split(".")[0] in old
    ]
    assert hits == []
