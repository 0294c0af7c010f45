from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugin.kubelet_stub import KubeletStub
from tests.plugin.plugin_process import Node, PluginProcess, wait_for


@pytest.fixture
def node() -> Iterator[Node]:
    # Short root on purpose: unix socket paths must fit in 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="hvp-", dir="/tmp"))
    yield Node(root)
    shutil.rmtree(root)
    assert not root.exists()


@pytest.fixture
def kubelet(node: Node) -> Iterator[KubeletStub]:
    stub = KubeletStub(node.plugin_dir)
    stub.start()
    yield stub
    stub.stop()


@pytest.fixture
def plugin(node: Node, kubelet: KubeletStub) -> Iterator[PluginProcess]:
    proc = PluginProcess(node, kubelet)
    try:
        kubelet.wait_registrations(1, 20)
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, f"plugin exited {code}; log:\n{proc.log_path.read_text()[-4000:]}"
        leftover = [p.name for p in node.plugin_dir.glob("hyperlight*.sock")]
        assert not leftover, f"plugin left sockets behind: {leftover}"


__all__ = ["wait_for"]
