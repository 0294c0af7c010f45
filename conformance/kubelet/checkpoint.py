"""The device manager checkpoint (`kubelet_internal_checkpoint`) in the kubelet's JSON shape.

Written like the kubelet's file store does it: a temporary file named "." + digits in the
plugin directory, then a rename. A plugin that reacts to every file created in the directory
sees the same noise it would see on a real node.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hv_device_plugin.api import deviceplugin_pb2 as pb

from .accounting import AllocationRecord

# The kubelet keys checkpointed device IDs by NUMA node; -1 means "no topology".
_NO_TOPOLOGY = "-1"


@dataclass(frozen=True)
class CheckpointData:
    """What a kubelet start reads back."""

    registered: dict[str, list[str]]
    allocations: list[AllocationRecord]


def encode(
    registered: Mapping[str, Iterable[str]], allocations: Iterable[AllocationRecord]
) -> bytes:
    """Serialise state in the kubelet's checkpoint layout."""
    entries = [
        {
            "PodUID": a.pod_uid,
            "ContainerName": a.container,
            "ResourceName": a.resource,
            "DeviceIDs": {_NO_TOPOLOGY: list(a.device_ids)},
            "AllocResp": base64.b64encode(a.response.SerializeToString()).decode("ascii"),
            # Not a kubelet field: keeps allocation identity stable across emulator restarts.
            "EmulatorAllocID": a.alloc_id,
        }
        for a in allocations
    ]
    data = {
        "Data": {
            "PodDeviceEntries": entries,
            "RegisteredDevices": {name: sorted(ids) for name, ids in registered.items()},
        },
        # The kubelet stores an FNV checksum of the Go struct; nothing here can reproduce it.
        "Checksum": 0,
    }
    return json.dumps(data, sort_keys=True).encode()


def decode(raw: bytes) -> CheckpointData:
    """Parse a checkpoint; raises ValueError when it is not one."""
    try:
        doc = json.loads(raw)
        body = doc["Data"]
        registered = {str(k): [str(i) for i in v] for k, v in body["RegisteredDevices"].items()}
        allocations: list[AllocationRecord] = []
        for n, entry in enumerate(body.get("PodDeviceEntries") or [], start=1):
            ids: list[str] = []
            for numa_ids in entry["DeviceIDs"].values():
                ids.extend(str(i) for i in numa_ids)
            response = pb.ContainerAllocateResponse()
            response.ParseFromString(base64.b64decode(entry["AllocResp"]))
            allocations.append(
                AllocationRecord(
                    alloc_id=int(entry.get("EmulatorAllocID", n)),
                    pod_uid=str(entry["PodUID"]),
                    container=str(entry["ContainerName"]),
                    resource=str(entry["ResourceName"]),
                    device_ids=tuple(ids),
                    response=response,
                    t=0.0,
                    restored=True,
                )
            )
    except Exception as err:  # JSON, key, type, base64 and protobuf errors share no base
        raise ValueError(f"corrupt checkpoint: {err}") from err
    return CheckpointData(registered, allocations)


def read(path: Path) -> CheckpointData | None:
    """Read the checkpoint; None when absent or corrupt (the kubelet then starts empty)."""
    try:
        return decode(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None


def write(path: Path, payload: bytes) -> None:
    """Atomically replace the checkpoint via a dot-prefixed temporary file."""
    fd, tmp = tempfile.mkstemp(prefix=".", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
