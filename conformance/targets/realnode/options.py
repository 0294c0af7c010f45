"""The real-node target's options: which container runtime its node runs.

Its flag and its typed object (hvconform.contract.target_options.NodeOptions), added to
`hvconform run` and built once by the registry.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from hvconform.contract.target_options import NodeOptions
from hvconform.targets import GroupFor, OptionInputs
from hvconform.targets.realnode.runtimes import RUNTIMES


def add_options(group_for: GroupFor, env: Mapping[str, str]) -> None:
    group = group_for("node")
    group.add_argument(
        "--node-runtime",
        choices=list(RUNTIMES),
        default="",
        help="the container runtime the node runs: "
        + "; ".join(f"{name}: {rt.about}" for name, rt in RUNTIMES.items())
        + " (default: containerd-1.7)",
    )


def options(ns: argparse.Namespace, inputs: OptionInputs) -> NodeOptions:
    return NodeOptions(node_runtime=ns.node_runtime)
