"""The node's ResourceSlice: the hypervisor as one shareable device, tainted while unusable.

One pool per node (named after the node, as the kubelet's own cleanup selects slices by node
name and driver), one slice in it, one device: `kvm` or `mshv`, with attributes a DeviceClass or
a claim can select on (the hypervisor kind, the KVM API version) and, because many pods share
one /dev/kvm, `allowMultipleAllocations` with a consumable `slots` capacity (KEP-5075, beta and
on by default in v1.37) bounding how many claims hold it at once.

Unusable device: the device stays listed, tainted NoSchedule (DRADeviceTaints, GA in v1.37), so
no new claim is allocated it while claims already running keep it (a NoExecute taint would
evict them for a device that may come back in a second). Usable again: the taint is removed.
The pool's generation grows with every change: the scheduler takes the highest one.

Why republish on every registration: the v1.37.2 kubelet deletes every ResourceSlice of its
node when it starts, and a driver's slices some time after the driver disconnects
(pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go wipeResourceSlices).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

TAINT_KEY = "hyperlight.dev/unusable"
# A DNS-1123 subdomain, as a node name and a driver name must be.
_SUBDOMAIN = re.compile(
    r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*"
)


@dataclass(frozen=True)
class SliceFacts:
    driver: str
    node: str
    hypervisor: str  # kvm or mshv
    api_version: int | None  # KVM_GET_API_VERSION when known
    slots: int

    def problems(self) -> list[str]:
        bad = [f"{what} {value[:80]!r} is not a DNS subdomain"
               for what, value in (("driver", self.driver), ("node", self.node))
               if len(value) > 253 or not _SUBDOMAIN.fullmatch(value)]  # fmt: skip
        if self.hypervisor not in ("kvm", "mshv"):
            bad.append(f"hypervisor {self.hypervisor[:20]!r} is neither kvm nor mshv")
        if not 1 <= self.slots <= 10_000:
            bad.append(f"slots {self.slots} out of 1..10000")
        return bad

    @property
    def name(self) -> str:
        # <node>-<driver>, cut to the 253 a name may have; stable across restarts
        return f"{self.node}-{self.driver}"[:253].rstrip("-.")


def resource_slice(
    facts: SliceFacts, *, generation: int, unusable_reason: str = "", consumable: bool = True
) -> dict[str, Any]:
    """The slice object; `consumable` False for a cluster without consumable capacity."""
    attributes: dict[str, Any] = {"hypervisor": {"string": facts.hypervisor}}
    if facts.api_version is not None:
        attributes["apiVersion"] = {"int": facts.api_version}
    device: dict[str, Any] = {"name": facts.hypervisor, "attributes": attributes}
    if consumable:
        device["allowMultipleAllocations"] = True
        device["capacity"] = {
            "slots": {
                "value": str(facts.slots),
                "requestPolicy": {"default": "1", "validRange": {"min": "1"}},
            }
        }
    if unusable_reason:
        device["taints"] = [
            {"key": TAINT_KEY, "value": _label_value(unusable_reason), "effect": "NoSchedule"}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": facts.name, "labels": {"app.kubernetes.io/managed-by": "hv-dra"}},
        "spec": {
            "driver": facts.driver,
            "nodeName": facts.node,
            "pool": {"name": facts.node, "generation": generation, "resourceSliceCount": 1},
            "devices": [device],
        },
    }


def _label_value(reason: str) -> str:
    """A taint value is a label value: 63 characters of [A-Za-z0-9_.-], alphanumeric ends."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", reason)[:63].strip("-_.")
    return cleaned or "unusable"
