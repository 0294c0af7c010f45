"""The validate subset: what can be judged on a serving node without disturbing it.

No fault is injected and nothing of the plugin's is written: these checks read what the plugin
and the kubelet report, and at most one workload takes one free slot for one real guest and
gives it back. A pool that cannot take fault injection (its nodes run workloads) is certified on
these; a node cordoned for conformance gets the whole catalogue. Each check is also part of every
full run, so a validate verdict means the same as the full run's row of the same id.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from hvconform.contract.node import CAP_LIVENESS, CAP_PODS, CAP_READINESS, Node
from hvconform.contract.results import EventKind, NotApplicable, Recorder
from hvconform.contract.wait import WaitExpired, wait_for
from hvconform.scenarios.common import FAULT_TIMEOUT_S, expect_live, require_spec

# The kubelet writes allocatable into the node status on its own period (10 s by default) and a
# plugin's readiness follows its own poll: both views are given this long to agree.
AGREE_TIMEOUT_S = FAULT_TIMEOUT_S


def _used_slots(node: Node) -> int | None:
    """Devices active pods hold, from the kubelet's pod-resources API; None if not readable."""
    if CAP_PODS not in node.capabilities:
        return None
    return sum(len(ids) for ids in node.pod_resources().devices.values())


def device_reported(node: Node, rec: Recorder) -> None:
    """The plugin advertises a device, the kubelet counts it healthy, the plugin's readiness
    says the same, and the plugin is alive as the kubelet judges liveness."""
    expect_live(node, rec, "serving node")
    capacity = node.capacity()
    rec.metric("capacity", capacity)
    assert capacity > 0, f"the kubelet lists no {node.resource} on this node: nothing registered"
    try:
        wait_for(lambda: node.allocatable() > 0, AGREE_TIMEOUT_S, "allocatable > 0")
    except WaitExpired:
        raise AssertionError(
            f"{node.resource}: capacity {capacity}, allocatable 0 for {AGREE_TIMEOUT_S:.0f} s: the "
            "plugin reports every device unhealthy (its device missing or unusable on this node)"
        ) from None
    rec.metric("allocatable", node.allocatable())
    if CAP_READINESS not in node.capabilities:
        rec.note("the plugin's readiness is not observable: judged on the kubelet's view alone")
        return
    try:
        wait_for(node.plugin_ready, AGREE_TIMEOUT_S, "plugin readiness while allocatable > 0")
    except WaitExpired:
        raise AssertionError(
            "the kubelet counts healthy devices but the plugin says it is not ready: the two "
            "views disagree"
        ) from None
    rec.event("ready, healthy devices counted", kind=EventKind.READY)


def cdi_spec_exact(node: Node, rec: Recorder) -> None:
    """The spec the plugin owns is a regular file, unchanged since setup, a CDI document of one
    kind whose device nodes are the node's real hypervisor device: read, never written."""
    require_spec(node)
    info = node.stat("cdi", node.spec_name)
    assert info is not None, f"the plugin's CDI spec {node.spec_name} is gone"
    assert info.kind == "file", f"{node.spec_name} is a {info.kind}, not a regular file"
    data = node.read_file("cdi", node.spec_name)
    assert data == node.baseline_spec, (
        f"{node.spec_name} changed while nothing was done to it (its content churns)"
    )
    spec = _parse(data)
    kind = spec.get("kind")
    assert isinstance(kind, str) and "/" in kind, (
        f"{node.spec_name}: kind {kind!r} is not vendor/class"
    )
    devices = spec.get("devices")
    assert isinstance(devices, list) and devices, f"{node.spec_name} defines no device"
    host = node.host_device_metadata()
    paths = _device_nodes(spec)
    rec.metric("devices", len(devices))
    for entry in paths:
        if "major" in entry and host.get("type") == "char":
            numbers = (entry.get("major"), entry.get("minor"))
            assert numbers == (host["major"], host["minor"]), (
                f"{node.spec_name} names {entry.get('path')} as {numbers[0]}:{numbers[1]}, the "
                f"node's device is {host['major']}:{host['minor']}: a stale spec"
            )
    rec.note(
        f"{node.spec_name}: kind {kind}, {len(devices)} device(s), {len(paths)} device node(s)"
    )


def _parse(data: bytes | None) -> dict[str, Any]:
    assert data is not None, "the plugin's CDI spec cannot be read"
    try:
        spec = json.loads(data)
    except ValueError:
        try:  # a YAML spec (the CDI format allows both)
            spec = yaml.safe_load(data)
        except yaml.YAMLError as exc:
            raise AssertionError(f"the CDI spec is neither JSON nor YAML: {exc}") from None
    assert isinstance(spec, dict), "the CDI spec is not a mapping"
    return spec


def _device_nodes(spec: dict[str, Any]) -> list[dict[str, Any]]:
    edits = [spec.get("containerEdits") or {}]
    edits += [(d or {}).get("containerEdits") or {} for d in spec.get("devices") or []]
    return [n for e in edits if isinstance(e, dict) for n in e.get("deviceNodes") or []
            if isinstance(n, dict)]  # fmt: skip


def _defined_devices(node: Node) -> set[str]:
    """Every fully qualified CDI device (kind=name) the specs in the node's CDI dir define."""
    defined = set()
    for name in node.list_files("cdi"):
        try:
            spec = _parse(node.read_file("cdi", name))
        except AssertionError:  # not a spec (an operator's notes, a half-written file)
            continue
        devices = spec.get("devices")
        if isinstance(devices, list):
            defined |= {
                f"{spec.get('kind')}={d.get('name')}" for d in devices if isinstance(d, dict)
            }
    return defined


def guest_on_free_slot(node: Node, rec: Recorder) -> None:
    """One free slot taken for one real guest, its CDI devices defined by the spec on the node,
    then the slot free again: the node's own workloads keep theirs."""
    allocatable = node.allocatable()
    used = _used_slots(node)
    if used is not None:
        rec.metric("slots_in_use", used)
        if allocatable - used <= 0:
            raise NotApplicable(
                f"no free slot: {used} of {allocatable} {node.resource} hold workloads; this "
                "node is not judged on a fresh guest"
            )
    allocation = node.allocate()
    try:
        assert allocation.ok, f"admission refused: {allocation.reason} {allocation.message}"
        if allocation.cdi_devices:
            # a device plugin's one spec, or a DRA driver's spec of this claim: any spec there
            defined = _defined_devices(node)
            unknown = [d for d in allocation.cdi_devices if d not in defined]
            assert not unknown, f"Allocate named {unknown}, which no CDI spec on the node defines"
        outcome = node.run_guest(allocation)
        assert outcome.ok, f"the guest failed: {outcome.detail}"
        rec.event("fresh guest passed (free slot)", kind=EventKind.GUEST)
    finally:
        node.release(allocation)
    if used is not None:
        wait_for(
            lambda: (_used_slots(node) or 0) <= used, AGREE_TIMEOUT_S, "the guest's slot free again"
        )
        rec.note(f"slot given back: {used} in use, as before")


def hypervisor_metadata(node: Node, rec: Recorder) -> None:
    """The node's hypervisor device: the character device its name says, its mode, owner and
    numbers as they were when the run began (nothing the plugin or the run did changed them)."""
    now = node.host_device_metadata()
    rec.note("device: " + ", ".join(f"{k} {v}" for k, v in sorted(now.items())))
    assert now.get("type") == "char", f"the node's hypervisor device is {now.get('type')}"
    start = node.host_metadata_at_start
    if not start:
        raise NotApplicable("the node's device metadata was not recorded at setup")
    changed = {k: (start.get(k), now.get(k)) for k in sorted(set(start) | set(now))
               if start.get(k) != now.get(k)}  # fmt: skip
    assert not changed, f"the device's metadata changed during the run: {changed}"
    if CAP_LIVENESS in node.capabilities:
        expect_live(node, rec, "after validation")
