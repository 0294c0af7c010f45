"""Targets by name. Each opens a Node for one pytest worker and guarantees its teardown."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from conformance.node import Node

TARGETS = ("local", "kind", "aks", "node")
# How the local target runs the plugin and workloads: "process" (sandboxed processes and the CDI
# runtime emulation) or "container" (the plugin image under Docker, workloads under podman).
RUNTIMES = ("process", "container")


@contextlib.contextmanager
def open_target(
    name: str,
    *,
    out_dir: Path,
    worker: str,
    plugin_cmd: str,
    runtime: str = "process",
    metadata: object | None = None,
) -> Iterator[Node]:
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")
    if name == "local":
        from conformance.targets.local import LocalNode

        node: LocalNode
        if runtime == "container":
            from conformance.targets.container import ContainerNode

            node = ContainerNode(out_dir=out_dir, worker=worker, plugin_cmd=plugin_cmd)
        else:
            node = LocalNode(out_dir=out_dir, worker=worker, plugin_cmd=plugin_cmd)
        try:
            node.setup()
            yield node
        finally:
            node.teardown()
        return
    if name in ("kind", "aks"):
        from conformance.targets.clusterrun import open_cluster
        from conformance.targets.plan import ClusterOptions

        options = ClusterOptions.from_env().with_(target=name)
        extra = {"metadata": metadata} if name == "kind" and metadata is not None else {}
        with open_cluster(options, out_dir=out_dir, **extra) as cluster_node:  # type: ignore[arg-type]
            yield cluster_node
        return
    if name == "node":
        from conformance.targets.node.realnode import RealNode

        real = RealNode(out_dir=out_dir, worker=worker, plugin_cmd=plugin_cmd)
        try:
            real.setup()
            yield real
        finally:
            real.teardown()
        return
    raise ValueError(f"unknown target {name!r}: choose one of {', '.join(TARGETS)}")
