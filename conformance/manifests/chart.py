"""The Helm chart (charts/hv-device-plugin) as the one source of the plugin's manifests.

`helm template` renders it; `hvconform manifests` and the cluster targets call it through
`template()`. helm is a Go program built from its module (`nox -s tests` and `nox -s helm` put
it next to the session's python); HV_HELM names another one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from conformance.contract.preconditions import Found, Requirement, ask

# One release name: no object name depends on it, so any name renders the same objects.
RELEASE: Final = "hv-device-plugin"
CHART_NAME: Final = "hv-device-plugin"
HELM_TIMEOUT_S: Final = 60.0


class ChartError(RuntimeError):
    """helm or the chart is missing, or helm refused the values (one line, helm's reason)."""


def chart_dir() -> Path:
    """charts/hv-device-plugin of the checkout this package runs from, or HV_CHART."""
    override = os.environ.get("HV_CHART")
    path = (
        Path(override) if override else Path(__file__).resolve().parents[2] / "charts" / CHART_NAME
    )
    if not (path / "Chart.yaml").is_file():
        raise ChartError(
            f"chart not found at {path}: run from a source checkout (pip install -e .) "
            "or set HV_CHART to the chart's directory"
        )
    return path


def target_values(target: str) -> Path:
    """The values file of one target (charts/hv-device-plugin/targets/<target>.yaml)."""
    return chart_dir() / "targets" / f"{target}.yaml"


class HelmMissing(ChartError):
    """No helm to run: an environment problem (exit 6 with the fix), not bad input."""


def helm_cache() -> Path:
    """Where `nox -s helm` puts the pinned helm for everyone on this machine (not a venv)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hv-device-plugin" / "bin" / "helm"


def helm_binary() -> str:
    """HV_HELM, else the helm next to this interpreter (a nox session's), else PATH's, else the
    one `nox -s helm` built into the user's cache."""
    override = os.environ.get("HV_HELM")
    if override:
        return override
    beside = Path(sys.executable).parent / "helm"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("helm")
    if found is not None:
        return found
    cached = helm_cache()
    if cached.is_file() and os.access(cached, os.X_OK):
        return str(cached)
    raise HelmMissing(
        f"helm not found: `./dev nox -s helm` builds the pinned one into {cached}, or set HV_HELM"
    )


def helm_requirement(feature: str, fix: str) -> Requirement:
    """The precondition of a run that renders the chart: a helm that answers `version`."""

    def probe() -> Found:
        try:
            binary = helm_binary()
        except ChartError as exc:
            return Found(f"missing ({exc})", False, "helm_binary()")
        line, shown = ask([binary, "version", "--short"])
        return Found(line or "unusable", line is not None, shown)

    return Requirement("helm", feature, "a working helm (v4)", fix, probe)


def _one_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return "; ".join(lines) or "no output"


def helm(args: Sequence[str], *, stdin: str | None = None) -> str:
    """Run helm; its stdout, or ChartError with helm's own words on one line."""
    argv = [helm_binary(), *args]
    try:
        done = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=HELM_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise HelmMissing(
            f"helm not found at {argv[0]}: `./dev nox -s helm` builds the pinned one"
        ) from None
    except subprocess.TimeoutExpired:
        raise ChartError(f"helm {args[0]} took longer than {HELM_TIMEOUT_S:g}s") from None
    if done.returncode != 0:
        raise ChartError(f"helm {args[0]}: {_one_line(done.stderr or done.stdout)}")
    return done.stdout


def template(
    namespace: str,
    values_files: Sequence[Path] = (),
    values: Mapping[str, Any] | None = None,
    *,
    chart: Path | None = None,
) -> str:
    """`helm template` of the chart: the files in order, then `values` on top (stdin)."""
    args = ["template", RELEASE, str(chart or chart_dir()), "--namespace", namespace]
    for path in values_files:
        args += ["--values", str(path)]
    if not values:
        return helm(args)
    return helm([*args, "--values", "-"], stdin=json.dumps(values))
