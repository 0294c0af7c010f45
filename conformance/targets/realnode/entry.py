"""The `node` target's registry entry: the plugin under test as its profile describes it, a
device plugin (node.RealNode) or a DRA driver (dra_node.RealDraNode)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from hvconform.contract.base import set_up
from hvconform.contract.runcontext import RunContext
from hvconform.targets.realnode.dra_node import RealDraNode
from hvconform.targets.realnode.node import RealNode


@contextmanager
def open_node(
    ctx: RunContext, *, worker: str, metadata: object | None = None
) -> Iterator[RealNode]:
    node = (RealDraNode if ctx.plugin.dra is not None else RealNode)(
        out_dir=ctx.out, worker=worker, plugin=ctx.plugin, node_runtime=ctx.node_runtime
    )
    with set_up(node) as up:
        yield up
