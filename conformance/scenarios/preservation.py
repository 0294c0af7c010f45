"""Preservation: what the plugin does not own is untouched, and running guests kept state."""

from __future__ import annotations

from hvconform.contract.node import CAP_LONG_GUEST, Node
from hvconform.contract.results import Recorder
from hvconform.contract.wait import wait_for


def preservation(node: Node, rec: Recorder) -> None:
    changed = [name for name, data in node.sentinels.items() if node.read_file("cdi", name) != data]
    rec.metric("sentinels", len(node.sentinels))
    assert node.sentinels, "no sentinel files were planted: nothing proves preservation"
    assert not changed, f"unrelated CDI files changed: {changed}"
    now = node.host_device_metadata()
    rec.note(f"host device metadata: {now}")
    assert now == node.host_metadata_at_start, (
        f"host device metadata changed: {node.host_metadata_at_start} -> {now}"
    )
    if CAP_LONG_GUEST in node.capabilities and node.session_guest:
        handle = node.session_guest
        before = node.long_guest_counter(handle)
        wait_for(
            lambda: node.long_guest_counter(handle) > before,
            30,
            "session-long guest still counting",
        )
        rec.metric("session_guest_counter", node.long_guest_counter(handle))
    else:
        rec.note("no session-long guest on this target")
