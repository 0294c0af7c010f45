"""CDI faults: missing, stale, malformed, non-regular path, read-only storage."""

from __future__ import annotations

import time

from hvconform.contract.node import CAP_READ_ONLY, CAP_READINESS, Node, require
from hvconform.contract.results import EventKind, Recorder
from hvconform.contract.wait import wait_for
from hvconform.scenarios.common import (
    FAULT_TIMEOUT_S,
    RECOVERY_TIMEOUT_S,
    expect_live,
    expect_unready,
    fresh_guest,
    require_spec,
    wait_ready,
    wait_spec_desired,
)


def _stale(baseline: bytes) -> bytes:
    # Same shape, one value changed: a stale spec from an older plugin version.
    return baseline.replace(b"65534", b"65533") if b"65534" in baseline else baseline + b" "


def _inject_and_recover(node: Node, rec: Recorder, label: str, inject: str) -> None:
    require_spec(node)
    wait_ready(node, rec, "before fault")
    t0 = time.monotonic()
    if inject == "missing":
        node.remove("cdi", node.spec_name)
    elif inject == "stale":
        node.write_file("cdi", node.spec_name, _stale(node.baseline_spec))
    else:
        node.write_file("cdi", node.spec_name, b'{"cdiVersion": "0.5.0", "kind": ')
    injected = rec.event(f"{label} injected", t0, kind=EventKind.FAULT)
    repaired = wait_spec_desired(node, RECOVERY_TIMEOUT_S, label)
    rec.event("spec byte-exact", repaired, kind=EventKind.REPAIRED)
    rec.metric("recovery_s", repaired - t0)
    rec.metric("ready_again_s", wait_ready(node, rec, "after repair") - injected)
    fresh_guest(node, rec, label)


def cdi_missing(node: Node, rec: Recorder) -> None:
    _inject_and_recover(node, rec, "missing spec", "missing")


def cdi_stale(node: Node, rec: Recorder) -> None:
    _inject_and_recover(node, rec, "stale spec", "stale")


def cdi_malformed(node: Node, rec: Recorder) -> None:
    _inject_and_recover(node, rec, "malformed spec", "malformed")


def cdi_non_regular(node: Node, rec: Recorder) -> None:
    require_spec(node)
    wait_ready(node, rec, "before fault")
    instance = node.plugin_instance()
    name = node.spec_name
    deadline = time.monotonic() + FAULT_TIMEOUT_S
    while True:  # the plugin may repair between remove and mkdir: retry until the dir stands
        node.remove("cdi", name)
        try:
            node.make_dir("cdi", name)
            break
        except FileExistsError:
            assert time.monotonic() < deadline, "could not place a directory at the spec path"
    t0 = rec.event("directory placed at spec path", kind=EventKind.FAULT)
    expect_unready(node, rec, "directory at spec", since=t0)
    wait_for(lambda: node.allocatable() == 0, FAULT_TIMEOUT_S, "allocatable 0 (directory at spec)")
    rec.metric("detected_s", rec.event("unready and allocatable 0", kind=EventKind.DETECTED) - t0)
    info = node.stat("cdi", name)
    assert info is not None and info.kind == "dir", "the plugin removed or replaced the obstruction"
    node.remove_dir("cdi", name)
    t1 = rec.event("obstruction removed", kind=EventKind.REPAIRED)
    wait_spec_desired(node, RECOVERY_TIMEOUT_S, "after obstruction removed")
    rec.metric("recovery_s", wait_ready(node, rec, "after obstruction", since=t1) - t1)
    assert node.plugin_instance() == instance, "recovery needed a plugin restart"
    fresh_guest(node, rec, "non-regular spec path")


def cdi_read_only(node: Node, rec: Recorder) -> None:
    require(node, CAP_READ_ONLY)
    require_spec(node)
    wait_ready(node, rec, "before fault")
    instance = node.plugin_instance()
    node.set_storage_read_only("cdi", True)  # an empty read-only view: the spec is missing
    t0 = rec.event("read-only CDI storage, spec missing", kind=EventKind.FAULT)
    try:
        expect_unready(node, rec, "read-only")
        if CAP_READINESS in node.capabilities:
            rec.metric("detected_s", rec.event("readiness false", kind=EventKind.DETECTED) - t0)
        expect_live(node, rec, "storage read-only")
        allocation = node.allocate()
        assert not allocation.ok, "allocation succeeded while the spec could not be written"
        rec.note(f"refused allocation: {allocation.reason}: {allocation.message}")
        assert node.read_file("cdi", node.spec_name) is None
    finally:
        node.set_storage_read_only("cdi", False)
    t1 = rec.event("storage writable again", kind=EventKind.REPAIRED)
    wait_spec_desired(node, RECOVERY_TIMEOUT_S, "after storage writable")
    rec.metric("recovery_s", wait_ready(node, rec, "after read-only") - t1)
    assert node.plugin_instance() == instance, "recovery needed a plugin restart"
    fresh_guest(node, rec, "read-only storage")
