"""The container runtime's hooks for the suite (`--runtime container` of the local target).

On top of the local target's needs: the Docker engine the plugin container runs under (a
private dockerd the harness starts, with its containerd; or --docker-host's, which must answer),
podman with CDI `--device` support for the workloads, on crun (runc cannot run on this cgroup
layout), debootstrap for the offline image base, and a cgroup hierarchy for podman's cgroupfs
manager; and helm when the plugin under test is deployed from a chart (its container is the
chart's render). Versions in the environment are asked from the programs themselves.
"""

from __future__ import annotations

from typing import Any

from hvconform.contract import hostfacts, runcontext
from hvconform.contract.preconditions import Found, Requirement, tool, version_of
from hvconform.contract.target_options import LocalOptions
from hvconform.manifests.chart import helm_requirement
from hvconform.targets.container.engine import ping
from hvconform.targets.local.preflight import local_requirements

BOOTSTRAP_FIX = "scripts/bootstrap (apt-get install docker.io podman crun debootstrap)"
DOCKERD_PATTERN = r"Docker version ([^\s,]+)"


def _external_engine(host: str) -> Requirement:
    def probe() -> Found:
        return Found("answering" if ping(host) else "not answering", ping(host), host)

    return Requirement(
        "Docker engine",
        "the plugin container (--docker-host)",
        f"an engine answering at {host}",
        "start that engine, or run without --docker-host and HV_DOCKER_HOST (a private dockerd "
        "is started then)",
        probe,
    )


def _docker_host() -> str:
    """The run's engine (--docker-host, in the run context); "" without a run: a private one."""
    try:
        return runcontext.current().options_of(LocalOptions).docker_host
    except (RuntimeError, OSError, ValueError):
        return ""


def _from_chart() -> bool:
    """The run's plugin is deployed from a chart (no run context: as the shipped profile is)."""
    try:
        deploy = runcontext.current().plugin.deploy
    except (RuntimeError, OSError, ValueError):
        return True
    return deploy is not None and deploy.chart is not None


def _helm() -> Requirement:
    return helm_requirement(
        "the plugin container is the profile's chart's render",
        "`./dev nox -s helm` builds the pinned one, or set HV_HELM",
    )


def _engine_requirements() -> list[Requirement]:
    external = _docker_host()
    if external:
        return [_external_engine(external)]
    return [
        tool(
            "Docker engine (dockerd)",
            ["dockerd", "--version"],
            minimum="20.10",
            feature="the plugin container, under a private engine the harness starts",
            fix=BOOTSTRAP_FIX,
            pattern=DOCKERD_PATTERN,
        ),
        tool(
            "containerd",
            ["containerd", "--version"],
            minimum="1.6",
            feature="the private dockerd's container supervisor",
            fix=BOOTSTRAP_FIX,
            pattern=r"containerd\s+\S+\s+v?(\S+)",
        ),
    ]


def preconditions(target: str = "local", runtime: str = "container") -> list[Requirement]:
    del target, runtime
    return [
        *local_requirements(workloads=False),  # workloads run under podman
        *_engine_requirements(),
        tool(
            "podman",
            ["podman", "--version"],
            minimum="4.1",
            feature="workloads get the device through CDI (podman run --device NAME)",
            fix=BOOTSTRAP_FIX,
        ),
        tool(
            "crun",
            ["crun", "--version"],
            minimum="1.0",
            feature="podman's OCI runtime for the workloads",
            fix=BOOTSTRAP_FIX,
        ),
        tool(
            "debootstrap",
            ["debootstrap", "--version"],
            minimum="1.0",
            feature="the images' base, built offline from Debian's mirror",
            fix=BOOTSTRAP_FIX,
        ),
        hostfacts.cgroups("podman's cgroupfs manager", ("memory", "pids")),
        *([_helm()] if _from_chart() else []),
    ]


def environment(target: str = "local", runtime: str = "container") -> dict[str, Any]:
    del target, runtime
    external = _docker_host()
    engine = (
        {"version": "external", "command": f"--docker-host {external}"}
        if external
        else version_of(["dockerd", "--version"], DOCKERD_PATTERN)
    )
    return {
        "components": {
            "docker engine": engine,
            "podman": version_of(["podman", "--version"]),
            "crun": version_of(["crun", "--version"]),
            "containerd": version_of(["containerd", "--version"], r"containerd\s+\S+\s+v?(\S+)"),
        }
    }
