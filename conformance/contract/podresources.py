"""The kubelet's pod-resources API (v1), as the suite reads it: a small protobuf reader of our
own and the two answers every target with a real kubelet decodes.

Wire facts (k8s.io/kubelet pkg/apis/podresources/v1; both requests are empty messages):
  AllocatableResourcesResponse { repeated ContainerDevices devices = 1; ... }
  ListPodResourcesResponse { repeated PodResources pod_resources = 1 }
  PodResources { string name = 1; string namespace = 2; repeated ContainerResources containers = 3 }
  ContainerResources { string name = 1; repeated ContainerDevices devices = 2; ... }
  ContainerDevices { string resource_name = 1; repeated string device_ids = 2; ... }

Defined once here: the node target reads the socket on this host, the cluster targets on a node
(directly, or through a diagnostic pod that returns the raw answer).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc

SERVICE_PATH = "/v1.PodResourcesLister/"
# The kubelet refuses more than 100 calls a second (burst 10: podresources/constants.go); a
# refused call is asked again a token later, within this.
RATE_LIMITED_FOR_S = 5.0


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs: varints as int, length-delimited as bytes."""
    out: list[tuple[int, int | bytes]] = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            out.append((num, value))
        elif wire == 2:
            size, i = _varint(buf, i)
            out.append((num, buf[i : i + size]))
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    return out


def strings(buf: bytes, num: int) -> list[str]:
    return [v.decode() for n, v in fields(buf) if n == num and isinstance(v, bytes)]


def messages(buf: bytes, num: int) -> list[bytes]:
    return [v for n, v in fields(buf) if n == num and isinstance(v, bytes)]


def devices(buf: bytes, num: int) -> dict[str, list[str]]:
    """The ContainerDevices of field `num`: resource -> device IDs."""
    found: dict[str, list[str]] = {}
    for dev in messages(buf, num):
        name = (strings(dev, 1) or [""])[0]
        found.setdefault(name, []).extend(strings(dev, 2))
    return found


def allocatable_devices(raw: bytes) -> dict[str, list[str]]:
    """An AllocatableResourcesResponse: resource -> the healthy device IDs (the device
    manager's healthy set: GetAllocatableDevices filters every known device by it)."""
    return devices(raw, 1)


@dataclass(frozen=True)
class PodDevices:
    namespace: str
    name: str
    container: str
    devices: dict[str, list[str]]  # resource -> device IDs


def listed_pods(raw: bytes) -> list[PodDevices]:
    """A ListPodResourcesResponse: one entry per container of every pod."""
    out = []
    for pod in messages(raw, 1):
        name, namespace = (strings(pod, 1) or [""])[0], (strings(pod, 2) or [""])[0]
        for container in messages(pod, 3):
            cname = (strings(container, 1) or [""])[0]
            out.append(PodDevices(namespace, name, cname, devices(container, 2)))
    return out


def call(socket: str, method: str, timeout: float = 5.0) -> bytes:
    """One call on the kubelet's socket (a path on this host); rate-limit refusals retried."""
    deadline = time.monotonic() + RATE_LIMITED_FOR_S
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = channel.unary_unary(
            SERVICE_PATH + method,
            request_serializer=lambda _: b"",
            response_deserializer=lambda raw: raw,
        )
        while True:
            try:
                result: bytes = stub(b"", timeout=timeout)
                return result
            except grpc.RpcError as exc:
                limited = exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                if not limited or time.monotonic() > deadline:
                    raise
            time.sleep(0.01)  # the limiter's next token (one every 10 ms), not a sync
