"""helm lint, the chart's metadata against pyproject.toml, and values.yaml against its schema."""

from __future__ import annotations

import tomllib
from typing import Any

import jsonschema
import pytest
import yaml

from hv_device_plugin.api.names import DEVICE_ACCESS_RESOURCE, PLUGIN_IMAGE_REPOSITORY
from hv_device_plugin.api.wire import CDI_DYNAMIC_DIR, DEVICE_PLUGIN_DIR
from hvconform.manifests import TARGETS
from hvconform.manifests.values_table import value_leaves, values_table
from tests.chart.helm import (
    CHART,
    DEFAULTS,
    ROOT,
    SCHEMA,
    containers,
    daemonsets,
    run_helm,
    template,
)

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.mark.parametrize("values", [None, *TARGETS])
def test_helm_lint_strict(values: str | None) -> None:
    extra = [] if values is None else ["--values", str(CHART / "targets" / f"{values}.yaml")]
    done = run_helm("lint", "--strict", str(CHART), *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_lint_catches_a_broken_template(tmp_path: Any) -> None:
    """Not vacuous: a copy of the chart with an unclosed action fails helm lint."""
    copy = tmp_path / "chart"
    copy.mkdir()
    for path in CHART.rglob("*"):
        dest = copy / path.relative_to(CHART)
        if path.is_dir():
            dest.mkdir(exist_ok=True)
        else:
            dest.write_bytes(path.read_bytes())
    (copy / "templates" / "broken.yaml").write_text("kind: {{ .Values.slots\n")
    done = run_helm("lint", "--strict", str(copy))
    assert done.returncode != 0


def test_chart_version_is_the_project_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = PYPROJECT["project"]["version"]
    assert chart["version"] == chart["appVersion"] == version


def test_values_yaml_meets_its_schema_and_its_defaults() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.Draft7Validator(SCHEMA).validate(DEFAULTS)
    # The table's `default` column is what values.yaml really sets.
    for key, sub in _leaves():
        node: Any = DEFAULTS
        for part in key.split("."):
            node = node[part]
        assert node == sub["default"], key


def _leaves() -> list[tuple[str, dict[str, Any]]]:
    return [(k, dict(v)) for k, v in value_leaves(SCHEMA)]


def test_every_value_is_described() -> None:
    for key, sub in _leaves():
        assert sub.get("description"), f"{key} has no description in values.schema.json"
        assert "default" in sub, f"{key} has no default in values.schema.json"


@pytest.mark.parametrize("readme", ["README.md", "charts/hv-device-plugin/README.md"])
def test_values_table_in_readme_is_generated_from_the_schema(readme: str) -> None:
    """Regenerate with `python -m hvconform.manifests.values_table`."""
    text = (ROOT / readme).read_text()
    table = values_table()
    assert table in text, f"{readme}: the values table differs from values.schema.json"
    assert table.count("\n") == len(_leaves()) + 2


def test_chart_facts_are_the_plugins() -> None:
    """The chart cannot import Python: its paths and names are checked against hv_device_plugin.api."""
    objs = template()
    assert DEFAULTS["image"]["repository"] == PLUGIN_IMAGE_REPOSITORY
    for component, c in containers(objs):
        args = c["args"]
        assert args[args.index("--device-plugin-dir") + 1] == DEVICE_PLUGIN_DIR
        if component == "hypervisor-plugin":
            assert args[args.index("--cdi-dir") + 1] == CDI_DYNAMIC_DIR
            assert c["resources"]["limits"][DEVICE_ACCESS_RESOURCE] == "1"
    paths = {
        v["hostPath"]["path"]
        for ds in daemonsets(objs).values()
        for v in ds["spec"]["template"]["spec"]["volumes"]
        if "hostPath" in v
    }
    assert paths == {DEVICE_PLUGIN_DIR, CDI_DYNAMIC_DIR, "/dev"}
