"""A predecessor that stops after this instance registered (a DaemonSet pod replaced while the
old one terminates; a rollout) must not leave the kubelet without devices. The kubelet keys
devices by resource name: the old instance's empty list on SIGTERM, or its stream's end, zeroes
what it holds for the new one (seen live on kind: restart-plugin's fresh guest refused with "no
healthy devices" after the new plugin was registered and streaming). So when another plugin
socket disappears from the directory, the plugin sends its device list again, now and 1 s later.
"""

from __future__ import annotations

import socket

from tests.plugin.kubelet_stub import KubeletStub
from tests.plugin.plugin_process import PluginProcess, Stream, wait_for


def test_a_removed_predecessor_socket_makes_the_plugin_resend_its_devices(
    plugin: PluginProcess, kubelet: KubeletStub
) -> None:
    stream = Stream(plugin.socket())
    try:
        wait_for(lambda: stream.snapshots, 10, "the first device list")
        first = stream.snapshots[0]
        assert first and all(health == "Healthy" for _, health in first)
        # an unrelated file going away is nothing
        (plugin.node.plugin_dir / "notes.txt").write_text("x")
        (plugin.node.plugin_dir / "notes.txt").unlink()
        # a real socket of an older instance, bound, then removed as grpcio does on stop
        old = plugin.node.plugin_dir / "hyperlight-0123abcd.sock"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(str(old))
        old.unlink()
        wait_for(lambda: len(stream.snapshots) >= 3, 10, "the device list sent twice more")
        assert all(snap == first for snap in stream.snapshots), stream.snapshots
        events = [e for e in plugin.events() if e.get("event") == "devices_reasserted"]
        assert len(events) == 1 and "hyperlight-0123abcd.sock" in events[0]["reason"], events
    finally:
        stream.cancel()
