"""What the scheduler allocated to a claim, for this driver: read from the ResourceClaim.

NodePrepareResources names a claim only (namespace, UID, name); which of the driver's devices
it got, and for which of its requests, is in the claim's status.allocation.devices.results
(resource.k8s.io/v1 DeviceRequestAllocationResult: request, driver, pool, device, shareID).
A driver prepares only the results with its own driver name (a claim may hold devices of other
drivers too), and refuses a claim whose UID is not the one the kubelet named (the claim was
deleted and re-created under the same name: preparing it would hand the device to the wrong
pod).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

MAX_RESULTS = 32  # resource.k8s.io/v1 AllocationResultsMaxSize


class ClaimError(Exception):
    """The claim cannot be prepared; the message is the kubelet-facing error."""


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class AllocatedDevice:
    request: str
    pool: str
    device: str
    share_id: str = ""


class ClaimSource(Protocol):
    """Reads a ResourceClaim object (the API server's JSON) by namespace and name."""

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...


def _text(value: Any, where: str, limit: int = 253) -> str:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise ClaimError(f"{where}: not a non-empty string of at most {limit} characters")
    return value


def allocated_devices(claim: dict[str, Any], ref: ClaimRef, driver: str) -> list[AllocatedDevice]:
    """This driver's allocation results of the claim, in the claim's order."""
    meta = claim.get("metadata") if isinstance(claim, dict) else None
    if not isinstance(meta, dict):
        raise ClaimError(f"claim {ref.namespace}/{ref.name}: no metadata")
    if meta.get("uid") != ref.uid:
        raise ClaimError(
            f"claim {ref.namespace}/{ref.name} has UID {str(meta.get('uid'))[:40]!r}, "
            f"the kubelet asked for {ref.uid!r}: it was re-created"
        )
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, dict) else None
    if not isinstance(allocation, dict):
        raise ClaimError(f"claim {ref.namespace}/{ref.name} is not allocated")
    devices = allocation.get("devices")
    results = devices.get("results") if isinstance(devices, dict) else None
    if not isinstance(results, list) or len(results) > MAX_RESULTS:
        raise ClaimError(f"claim {ref.namespace}/{ref.name}: no allocation results")
    mine: list[AllocatedDevice] = []
    for i, result in enumerate(results):
        where = f"claim {ref.namespace}/{ref.name} result {i}"
        if not isinstance(result, dict):
            raise ClaimError(f"{where}: not an object")
        if result.get("driver") != driver:
            continue
        share = result.get("shareID")
        mine.append(
            AllocatedDevice(
                _text(result.get("request"), f"{where}.request"),
                _text(result.get("pool"), f"{where}.pool"),
                _text(result.get("device"), f"{where}.device", 128),
                _text(share, f"{where}.shareID", 64) if share is not None else "",
            )
        )
    if not mine:
        raise ClaimError(f"claim {ref.namespace}/{ref.name}: nothing allocated by {driver}")
    return mine
