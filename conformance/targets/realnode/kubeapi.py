"""Observing the real node: the API server (JSON over mutual TLS) and the kubelet's podresources
gRPC API on this host (decoded by hvconform.contract.podresources).
"""

from __future__ import annotations

import http.client
import json
import ssl
from pathlib import Path
from typing import Any

from hvconform.contract import podresources
from hvconform.contract.podresources import PodDevices, allocatable_devices
from hvconform.contract.quantity import quantity
from hvconform.targets.realnode import API_PORT, PODRESOURCES_SOCKET

# quantity: kept importable here
__all__ = ["Api", "ApiError", "PodDevices", "PodResources", "allocatable_devices", "quantity"]


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


class PodResources:
    """The kubelet's podresources API on its unix socket (hvconform.contract.podresources)."""

    def __init__(self, socket: Path = PODRESOURCES_SOCKET) -> None:
        self.socket = socket

    def allocatable(self) -> dict[str, list[str]]:
        """resource -> device IDs the kubelet considers allocatable."""
        return allocatable_devices(podresources.call(str(self.socket), "GetAllocatableResources"))

    def pods(self) -> list[PodDevices]:
        return podresources.listed_pods(podresources.call(str(self.socket), "List"))
