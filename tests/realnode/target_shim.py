"""pytest plugin: `--target node` before the registry knows it (`-p tests.realnode.target_shim`).

Until conformance/targets/registry.py names the node target, this wraps `open_target` so the
suite can run against RealNode: `python -m pytest conformance/suite -c conformance/suite/pytest.ini
-p conformance.pytest_plugin -p tests.realnode.target_shim --target node --out DIR`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from conformance.node import Node
from conformance.targets import registry

_original: Callable[..., Any] = registry.open_target


@contextlib.contextmanager
def _open_target(
    name: str, *, out_dir: Path, worker: str, plugin_cmd: str, runtime: str = "process"
) -> Iterator[Node]:
    if name != "node":
        kwargs = {
            "out_dir": out_dir,
            "worker": worker,
            "plugin_cmd": plugin_cmd,
            "runtime": runtime,
        }
        with _original(name, **kwargs) as node:
            yield node
        return
    from conformance.targets.node.realnode import RealNode

    real = RealNode(out_dir=out_dir, worker=worker, plugin_cmd=plugin_cmd)
    try:
        real.setup()
        yield real
    finally:
        real.teardown()


registry.open_target = _open_target
