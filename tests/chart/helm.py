"""The chart as the tests see it: `helm template` with values, parsed into objects.

helm is the one hvconform.manifests.chart finds (the nox session's, built from its Go
module); a missing helm fails the tests, it never skips them.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from hvconform.manifests.chart import chart_dir, helm_binary

ROOT = Path(__file__).resolve().parents[2]
CHART = chart_dir()
NAMESPACE = "hyperlight-system"
SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
DEFAULTS: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())


def run_helm(
    *args: str, values: Mapping[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    """helm with `values` on stdin (`--values -`); never raises on a non-zero exit."""
    argv = [helm_binary(), *args]
    if values is not None:
        argv += ["--values", "-"]
    return subprocess.run(
        argv,
        input=None if values is None else json.dumps(values),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


def template_text(values: Mapping[str, Any] | None = None, *extra: str) -> str:
    done = run_helm("template", "hv-device-plugin", str(CHART), "--namespace", NAMESPACE, *extra,
                    values=values)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def parse(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def template(values: Mapping[str, Any] | None = None, *extra: str) -> list[dict[str, Any]]:
    """The objects `helm template` renders for the chart's defaults plus `values`."""
    return parse(template_text(values, *extra))


def refusal(values: Mapping[str, Any]) -> str:
    """helm's error for values it must refuse (the test fails if helm renders them)."""
    done = run_helm("template", "hv-device-plugin", str(CHART), values=values)
    assert done.returncode != 0, f"helm rendered refused values {values}"
    return done.stderr


def daemonsets(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The DaemonSets by their app.kubernetes.io/component."""
    return {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o
        for o in objs
        if o["kind"] == "DaemonSet"
    }


def containers(objs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for component, ds in daemonsets(objs).items():
        for c in ds["spec"]["template"]["spec"]["containers"]:
            yield component, c
