"""What DRA checks may do to, and observe on, a node whose plugin under test is a DRA driver.

A target that runs a DRA driver declares CAP_DRA and implements this on top of the Node
contract; checks of the device plugin API end not_applicable there, DRA checks everywhere else
(conformance.scenarios: each check names the API it judges). The catalogue's own observations
keep their meaning: capacity() is the number of devices the driver publishes for the node in
its ResourceSlices, allocatable() the number of those without a NoSchedule or NoExecute taint,
allocate() a pod asking for the DeviceClass's extended resource, scheduled (the scheduler
allocates DRA claims; a pod bound by hand never gets one) and refused when it is unschedulable
or its NodePrepareResources fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from conformance.contract.dra_profile import API_DEVICE_PLUGIN, API_DRA
from conformance.contract.node import Node, PodView

# The plugin under test is a DRA driver on this node (checks of the device plugin API do not
# apply; the DRA checks do).
CAP_DRA = "dra"


def plugin_api(node: Node) -> str:
    """The kubelet API the node's plugin under test speaks."""
    return API_DRA if CAP_DRA in node.capabilities else API_DEVICE_PLUGIN


@dataclass(frozen=True)
class SliceView:
    """One ResourceSlice of the driver for this node, as the API server has it."""

    uid: str  # a slice deleted and published again has a new one
    devices: int
    tainted: int  # devices with a NoSchedule or NoExecute taint
    shared: int = 0  # devices several claims may be allocated at once (allowMultipleAllocations)


class DraNode(Node, Protocol):
    def slices(self) -> list[SliceView]: ...
    def stop_kubelet(self, graceful: bool) -> None: ...
    def start_kubelet(self) -> float: ...  # monotonic time its socket was made
    def submit_pod(self) -> str: ...  # a check's pod made, not waited for: its name
    def pod_named(self, name: str) -> PodView | None: ...
    def pod_scheduled(self, name: str) -> bool: ...  # bound to the node, its claims allocated
    def prepare_failures(self, name: str) -> int: ...  # FailedPrepareDynamicResources events
