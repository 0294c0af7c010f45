"""Defaults every target inherits: what a target cannot do answers not_applicable, never passes.

Operations built from a target's file primitives (the device view) are written once here; a
target overrides them where it has a better way (the local node reaches into the plugin's own
mount namespace).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, TypeVar

from hvconform.contract.node import Area, FileInfo
from hvconform.contract.results import NotApplicable

DEVICE = "kvm"  # the hypervisor node's name in a host-device view


def specs_declaring(node: Any, cdi_devices: Sequence[str]) -> set[str]:
    """The CDI spec files that declare any of these fully-qualified CDI device names. A name is
    unique across the specs a runtime reads, so they are the files the devices came from (one
    claim's, where a DRA driver writes a spec per claim; another plugin's spec of the same kind,
    a device plugin's left on a node moved to DRA, is not among them)."""
    wanted = {tuple(d.split("=", 1)) for d in cdi_devices if "=" in d}
    found = set()
    for name in node.list_files("cdi"):
        try:
            spec = json.loads(node.read_file("cdi", name) or b"")
            declared = {(spec["kind"], d["name"]) for d in spec.get("devices") or []}
        except (ValueError, TypeError, KeyError, AttributeError):
            continue  # not a spec (a sentinel, a fault's leftover)
        if declared & wanted:
            found.add(str(name))
    return found


def discover_spec(node: Any, cdi_devices: Sequence[str]) -> str:
    """The one top-level file in the CDI dir that declares the allocated device (else the one
    that declares its kind); "" when the plugin injects no CDI device (then the CDI checks do
    not apply)."""
    if not cdi_devices:
        return ""
    exact = specs_declaring(node, cdi_devices) - set(node.sentinels)
    if len(exact) == 1:
        return exact.pop()
    kind = cdi_devices[0].partition("=")[0]
    found = []
    for name in sorted(node.list_files("cdi")):
        if name in node.sentinels:
            continue
        data = node.read_file("cdi", name) or b""
        try:
            declared = json.loads(data).get("kind")
        except (ValueError, AttributeError):
            continue
        if declared == kind:
            found.append(name)
    if len(found) != 1:
        raise AssertionError(
            f"want exactly one spec in the CDI dir declaring kind {kind!r}, found {found or 'none'}"
        )
    return str(found[0])


class NodeBase:
    """Mixin for Node implementations; see hvconform.contract.node.Node for the contract."""

    name: str
    _device_info: FileInfo | None = None

    # Primitives the defaults are built on; each target implements them.
    def stat(self, area: Area, name: str) -> FileInfo | None:
        raise NotApplicable(f"target '{self.name}' cannot inspect its {area} area")

    def remove(self, area: Area, name: str) -> None:
        raise NotApplicable(f"target '{self.name}' cannot change its {area} area")

    def make_char_device(self, area: Area, name: str, major: int, minor: int) -> None:
        raise NotApplicable(f"target '{self.name}' cannot make device nodes")

    def set_device_present(self, present: bool) -> None:
        """Take the hypervisor node out of the host-device view, or put it back as it was."""
        if not present:
            info = self.stat("host_dev", DEVICE)
            if info is None or info.kind != "char":
                raise AssertionError(f"the host view has no {DEVICE} character device")
            self._device_info = info
            self.remove("host_dev", DEVICE)
            return
        info = self._device_info
        if info is not None and self.stat("host_dev", DEVICE) is None:
            self.make_char_device("host_dev", DEVICE, info.rdev_major, info.rdev_minor)

    def start_plugin_isolated(self) -> None:
        raise NotApplicable(f"target '{self.name}' cannot start the plugin in an isolated dir")

    def restore_plugin_sockets(self) -> None:
        raise NotApplicable(f"target '{self.name}' cannot start the plugin in an isolated dir")

    def start_rollout(self) -> None:
        raise NotApplicable(f"target '{self.name}' does not deploy the plugin with a rollout")

    def rollout_done(self) -> bool:
        raise NotApplicable(f"target '{self.name}' does not deploy the plugin with a rollout")

    def restore_baseline(self) -> list[str]:
        """Put the node back as it was before the last check; what could not be restored.

        The default verifies nothing: a target without a way to restore answers that it kept
        nothing to restore (its checks clean up after themselves)."""
        return []


class Managed(Protocol):
    def setup(self) -> None: ...
    def teardown(self) -> None: ...


N = TypeVar("N", bound=Managed)


@contextlib.contextmanager
def set_up(node: N) -> Iterator[N]:
    """A node's whole life for a registry entry: set up, yielded, always torn down."""
    try:
        node.setup()
        yield node
    finally:
        node.teardown()
