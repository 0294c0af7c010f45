"""Observing the real node: the API server (JSON over mutual TLS) and the kubelet's podresources
gRPC API (`/v1.PodResourcesLister`), decoded with a small protobuf reader of our own.

podresources v1 wire facts used here (k8s.io/kubelet pkg/apis/podresources/v1):
  AllocatableResourcesResponse { repeated ContainerDevices devices = 1; ... }
  ListPodResourcesResponse { repeated PodResources pod_resources = 1 }
  PodResources { string name = 1; string namespace = 2; repeated ContainerResources containers = 3 }
  ContainerResources { string name = 1; repeated ContainerDevices devices = 2; ... }
  ContainerDevices { string resource_name = 1; repeated string device_ids = 2; ... }
Both requests are empty messages.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from conformance.contract.quantity import quantity
from conformance.targets.realnode import API_PORT, PODRESOURCES_SOCKET

RATE_LIMITED_FOR_S = 5.0

# quantity: kept importable here
__all__ = ["Api", "ApiError", "PodResources", "allocatable_devices", "quantity"]


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"API status {status}: {body[:300]}")
        self.status = status


class Api:
    """A client-certificate HTTPS client for the loopback API server."""

    def __init__(self, pki: Path, client: str = "admin", port: int = API_PORT) -> None:
        self.ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.ctx.load_cert_chain(str(pki / f"{client}.crt"), str(pki / f"{client}.key"))
        self.port = port

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=10)
        try:
            data = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": content_type} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            text = resp.read().decode(errors="replace")
        finally:
            conn.close()
        if resp.status >= 300:
            raise ApiError(resp.status, text)
        return json.loads(text) if text.startswith(("{", "[")) else text

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def ready(self) -> bool:
        try:
            return bool(self.request("GET", "/readyz") == "ok")
        except (OSError, ApiError, ssl.SSLError):
            return False


# -- protobuf reading ------------------------------------------------------------------------


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
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return out


def _strings(buf: bytes, num: int) -> list[str]:
    return [v.decode() for n, v in fields(buf) if n == num and isinstance(v, bytes)]


def _messages(buf: bytes, num: int) -> list[bytes]:
    return [v for n, v in fields(buf) if n == num and isinstance(v, bytes)]


def _devices(buf: bytes, num: int) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for dev in _messages(buf, num):
        name = (_strings(dev, 1) or [""])[0]
        found.setdefault(name, []).extend(_strings(dev, 2))
    return found


def allocatable_devices(raw: bytes) -> dict[str, list[str]]:
    """An AllocatableResourcesResponse: resource -> the healthy device IDs (the device
    manager's healthy set: GetAllocatableDevices filters every known device by it)."""
    return _devices(raw, 1)


@dataclass(frozen=True)
class PodDevices:
    namespace: str
    name: str
    container: str
    devices: dict[str, list[str]]  # resource -> device IDs


class PodResources:
    """The kubelet's podresources API on its unix socket."""

    def __init__(self, socket: Path = PODRESOURCES_SOCKET) -> None:
        self.socket = socket

    def _call(self, method: str) -> bytes:
        """One call; refused by the kubelet's rate limit (podresources/constants.go: 100 a
        second, a burst of 10; the node's event sampler uses some), asked again a token later."""
        deadline = time.monotonic() + RATE_LIMITED_FOR_S
        with grpc.insecure_channel(f"unix://{self.socket}") as channel:
            call = channel.unary_unary(
                f"/v1.PodResourcesLister/{method}",
                request_serializer=lambda _: b"",
                response_deserializer=lambda raw: raw,
            )
            while True:
                try:
                    result: bytes = call(b"", timeout=5)
                    return result
                except grpc.RpcError as exc:
                    limited = exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    if not limited or time.monotonic() > deadline:
                        raise
                time.sleep(0.01)  # the limiter's next token (one every 10 ms), not a sync

    def allocatable(self) -> dict[str, list[str]]:
        """resource -> device IDs the kubelet considers allocatable."""
        return allocatable_devices(self._call("GetAllocatableResources"))

    def pods(self) -> list[PodDevices]:
        out = []
        for pod in _messages(self._call("List"), 1):
            name, namespace = (_strings(pod, 1) or [""])[0], (_strings(pod, 2) or [""])[0]
            for container in _messages(pod, 3):
                cname = (_strings(container, 1) or [""])[0]
                out.append(PodDevices(namespace, name, cname, _devices(container, 2)))
        return out
