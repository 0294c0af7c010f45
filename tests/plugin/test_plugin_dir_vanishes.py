"""The kubelet's plugin directory removed under the running plugin (a node agent wiping
/var/lib/kubelet, a hostPath remounted): the plugin must not crash. It reports itself not
registered while it cannot serve, and serves and registers again as soon as the directory and
the kubelet are back. Found by the bench: the plugin exited with grpcio's bind RuntimeError."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from tests.plugin.kubelet_stub import KubeletStub
from tests.plugin.plugin_process import PluginProcess, wait_for


def _registered(plugin: PluginProcess) -> bool:
    """The readiness condition the registration owns (a stub kubelet opens no stream)."""
    conditions = plugin.http("/readyz")[1]["conditions"]
    return bool(conditions["registered"]["ok"])


def _removed(path: Path) -> bool:
    shutil.rmtree(path, ignore_errors=True)
    return not path.exists()


def test_plugin_survives_its_directory_vanishing(
    plugin: PluginProcess, kubelet: KubeletStub
) -> None:
    wait_for(lambda: _registered(plugin), 10, "registered")
    kubelet.stop()
    # The plugin serves again on a fresh socket as soon as its own one goes, possibly inside the
    # directory while rmtree is still emptying it: remove until it stays removed.
    wait_for(lambda: _removed(plugin.node.plugin_dir), 10, "the plugin dir removed")
    wait_for(lambda: not _registered(plugin), 10, "not registered with the plugin dir gone")
    wait_for(
        lambda: any(e.get("event") == "serve_failed" for e in plugin.events()),
        10,
        "a serve_failed log line while the dir is gone",
    )
    assert plugin.proc.poll() is None, f"plugin exited: {plugin.log_path.read_text()[-2000:]}"
    started = time.monotonic()
    kubelet.start()  # makes the directory again, then kubelet.sock
    reg = kubelet.wait_serving_after(started, 20)
    assert (plugin.node.plugin_dir / reg.endpoint).is_socket()
    wait_for(lambda: _registered(plugin), 10, "registered again once the dir and kubelet are back")
    errors = [e for e in plugin.events() if e.get("level") == "error"]
    assert not errors, errors
