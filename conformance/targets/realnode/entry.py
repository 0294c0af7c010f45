"""The `node` target's registry entry: the plugin under test as its profile describes it, a
device plugin (node.RealNode) or a DRA driver (dra_node.RealDraNode)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from hvconform.contract.base import set_up
from hvconform.contract.plugin import PluginUnderTest
from hvconform.contract.runcontext import RunContext
from hvconform.contract.target_options import NodeOptions
from hvconform.targets.local.plan import command_line, machine_plan
from hvconform.targets.realnode import KUBERNETES_VERSION, NODE_NAME, RUN, STATE, runtimes
from hvconform.targets.realnode.dra_node import RealDraNode
from hvconform.targets.realnode.node import RealNode


@contextmanager
def open_node(
    ctx: RunContext, *, worker: str, metadata: object | None = None
) -> Iterator[RealNode]:
    node = (RealDraNode if ctx.plugin.dra is not None else RealNode)(
        out_dir=ctx.out,
        worker=worker,
        plugin=ctx.plugin,
        node_runtime=ctx.options_of(NodeOptions).node_runtime,
    )
    with set_up(node) as up:
        yield up


def plan_text(options: NodeOptions, plugin: PluginUnderTest) -> str:
    """--dry-run: what a run on this target would start, make and remove."""
    rt = runtimes.runtime(options.node_runtime)
    return machine_plan(
        "--target node",
        plugin,
        [
            f"the node: {rt.about}, etcd, the API server, controller manager and scheduler and "
            f"the kubelet {KUBERNETES_VERSION} as host processes on loopback, the kubelet "
            f"registered as Node {NODE_NAME}; state below {STATE} and {RUN} only",
            f"the plugin: {command_line(plugin)}, in a sandbox (zero capabilities, "
            "no_new_privs, its own mount and network namespaces), the kubelet's directories "
            "bound where its profile's paths say",
            "workloads: pods of the suite's guest image, scheduled by the API server and run "
            "by containerd with the device the CDI spec declares",
        ],
        [
            f"every process stopped and {STATE}, {RUN} and the kubelet root removed, then "
            "verified: nothing left (node-down's check)"
        ],
    )
