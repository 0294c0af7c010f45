"""The local target's options: how the plugin and the workloads run on this machine.

Its flags and their typed object (hvconform.contract.target_options.LocalOptions); the
registry adds the flags to `hvconform run` and builds the object once, from the parsed flags.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from hvconform.contract.args import docker_host_arg
from hvconform.contract.target_options import LocalOptions
from hvconform.targets import RUNTIMES, GroupFor, OptionInputs


def add_options(group_for: GroupFor, env: Mapping[str, str]) -> None:
    group = group_for("local")
    group.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=RUNTIMES[0],
        help="plugin and workloads as sandboxed processes, or as containers (the plugin image "
        "under Docker, workloads under podman via CDI)",
    )
    group.add_argument(
        "--docker-host",
        default=env.get("HV_DOCKER_HOST", ""),
        type=docker_host_arg(env),
        metavar="URL",
        help="--runtime container: the Docker engine that runs the plugin container (unix://, "
        "tcp:// or ssh://, and it must answer); default: a private dockerd the harness starts "
        "with roots of its own [HV_DOCKER_HOST]",
    )


def options(ns: argparse.Namespace, inputs: OptionInputs) -> LocalOptions:
    return LocalOptions(runtime=ns.runtime, docker_host=ns.docker_host)
