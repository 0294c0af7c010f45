"""Targets by name. Each opens a Node for one pytest worker and guarantees its teardown."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from conformance.node import Node

TARGETS = ("local",)
# How the local target runs the plugin and workloads: "process" (sandboxed processes and the CDI
# runtime emulation) or "container" (the plugin image under Docker, workloads under podman).
RUNTIMES = ("process", "container")


@contextlib.contextmanager
def open_target(
    name: str, *, out_dir: Path, worker: str, plugin_cmd: str, runtime: str = "process"
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
    raise ValueError(f"unknown target {name!r}: choose one of {', '.join(TARGETS)}")
