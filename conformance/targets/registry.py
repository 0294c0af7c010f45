"""Targets by name. Each opens a Node for one pytest worker and guarantees its teardown."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from conformance.node import Node

TARGETS = ("local",)


@contextlib.contextmanager
def open_target(name: str, *, out_dir: Path, worker: str, plugin_cmd: str) -> Iterator[Node]:
    if name == "local":
        from conformance.targets.local import LocalNode

        node = LocalNode(out_dir=out_dir, worker=worker, plugin_cmd=plugin_cmd)
        try:
            node.setup()
            yield node
        finally:
            node.teardown()
        return
    raise ValueError(f"unknown target {name!r}: choose one of {', '.join(TARGETS)}")
