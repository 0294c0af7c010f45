"""The settings a user gives a run by environment variable, defined once, read once.

Each is a typed field of `RunSettings`. `hvconform run` reads them from its environment once
(`from_env`), writes them into the run context, and every process of the run (the pytest
controller, its xdist workers) installs them from there: after the CLI, nothing reads these
variables again. A process that is not part of a run (`hvconform manifests`, the image and node
builds, a test calling one function) has no run context, and `current()` reads the environment
at the call instead.

Where this machine keeps caches and roots (HV_IMAGE_CACHE, HV_KIND_CACHE, HV_DOCKER_DATA_ROOT,
...) is the machine's layout, not a run's setting: those stay module constants of their owners
(tests/conformance/test_env_reads.py lists every environment read and why it is one).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

# field -> the environment variable that gives it (and what it is, for --help and docs)
ENV: dict[str, tuple[str, str]] = {
    "helm": ("HV_HELM", "the helm binary that renders charts (else the pinned one, PATH's)"),
    "chart": ("HV_CHART", "the hv-device-plugin chart's directory (else the package's copy)"),
    "kind_docker_host": (
        "HV_KIND_DOCKER_HOST",
        "kind: the Docker engine that runs the cluster's nodes (else a private one)",
    ),
    "workload_python": (
        "HV_WORKLOAD_PYTHON",
        "the interpreter that runs workloads as their unprivileged user (else the first that can)",
    ),
    "chromium": ("HV_CHROMIUM", "the browser that checks the HTML report (else PATH's chromium)"),
}


@dataclass(frozen=True)
class RunSettings:
    helm: str = ""
    chart: str = ""
    kind_docker_host: str = ""
    workload_python: str = ""
    chromium: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RunSettings:
        source = os.environ if environ is None else environ
        return cls(**{name: source.get(var, "") for name, (var, _) in ENV.items()})

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunSettings:
        known = {f.name for f in fields(cls)}
        return cls(**{k: str(v) for k, v in data.items() if k in known})


_INSTALLED: list[RunSettings] = []


def install(settings: RunSettings) -> None:
    """This process belongs to a run: its settings, from the CLI or the run context."""
    _INSTALLED[:] = [settings]


def uninstall() -> None:
    """This process no longer belongs to a run (a test that called the CLI in-process)."""
    _INSTALLED.clear()


def current() -> RunSettings:
    """The run's settings; outside a run, the environment as it is now."""
    return _INSTALLED[0] if _INSTALLED else RunSettings.from_env()
