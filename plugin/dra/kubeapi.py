"""The few API-server calls a DRA driver makes, over HTTPS with the standard library only.

A driver reads the ResourceClaims it prepares and writes its own node's ResourceSlice; nothing
else. In a pod it authenticates as its service account (the token and CA the kubelet mounts at
/var/run/secrets/kubernetes.io/serviceaccount, the API server from KUBERNETES_SERVICE_HOST/PORT);
outside one (a node target running the driver as a process) the caller names the server, the CA
and a token or a client certificate. Responses are bounded and every error names the call.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hv_device_plugin.api.dra_wire import RESOURCE_API

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_RESPONSE = 16 << 20
TIMEOUT_S = 10.0


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ApiAccess:
    server: str  # https://host:port
    ca_file: str
    token_file: str = ""
    client_cert: str = ""
    client_key: str = ""

    @classmethod
    def in_cluster(cls) -> ApiAccess:
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ApiError(0, "not in a pod (KUBERNETES_SERVICE_HOST unset): name the API server")
        if ":" in host:  # an IPv6 service address
            host = f"[{host}]"
        return cls(f"https://{host}:{port}", str(SERVICE_ACCOUNT / "ca.crt"),
                   token_file=str(SERVICE_ACCOUNT / "token"))  # fmt: skip


class KubeApi:
    def __init__(self, access: ApiAccess) -> None:
        url = urllib.parse.urlsplit(access.server)
        if url.scheme != "https" or not url.hostname:
            raise ApiError(0, f"API server {access.server[:100]!r}: not an https:// URL")
        self.host, self.port = url.hostname, url.port or 443
        self.access = access
        self._tls = ssl.create_default_context(cafile=access.ca_file)
        if access.client_cert:
            self._tls.load_cert_chain(access.client_cert, access.client_key or None)

    def _token(self) -> str:
        # re-read per call: the kubelet rotates projected service-account tokens
        if not self.access.token_file:
            return ""
        return Path(self.access.token_file).read_text().strip()

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Accept": "application/json"}
        if token := self._token():
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPSConnection(
            self.host, self.port, context=self._tls, timeout=TIMEOUT_S
        )
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read(MAX_RESPONSE + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise ApiError(0, f"{method} {path}: {exc}") from None
        finally:
            conn.close()
        if len(raw) > MAX_RESPONSE:
            raise ApiError(resp.status, f"{method} {path}: response larger than {MAX_RESPONSE}")
        if resp.status >= 300:
            try:
                message = str(json.loads(raw).get("message", ""))
            except (ValueError, AttributeError):
                message = raw[:200].decode(errors="replace")
            raise ApiError(resp.status, f"{method} {path}: {resp.status} {message[:300]}")
        return json.loads(raw) if raw else None

    # -- what the driver needs ------------------------------------------------------------

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        ns, nm = urllib.parse.quote(namespace, safe=""), urllib.parse.quote(name, safe="")
        claim: dict[str, Any] = self.request(
            "GET", f"/apis/{RESOURCE_API}/namespaces/{ns}/resourceclaims/{nm}"
        )
        return claim

    def apply_slice(self, slice_obj: dict[str, Any]) -> dict[str, Any]:
        """Create the slice, or replace it (with the live resourceVersion) when it exists."""
        name = urllib.parse.quote(slice_obj["metadata"]["name"], safe="")
        base = f"/apis/{RESOURCE_API}/resourceslices"
        try:
            live = self.request("GET", f"{base}/{name}")
        except ApiError as exc:
            if exc.status != 404:
                raise
            created: dict[str, Any] = self.request("POST", base, slice_obj)
            return created
        meta = {**slice_obj["metadata"], "resourceVersion": live["metadata"]["resourceVersion"]}
        body = {**slice_obj, "metadata": meta}
        replaced: dict[str, Any] = self.request("PUT", f"{base}/{name}", body)
        return replaced

    def delete_slice(self, name: str) -> None:
        try:
            self.request(
                "DELETE", f"/apis/{RESOURCE_API}/resourceslices/{urllib.parse.quote(name, safe='')}"
            )
        except ApiError as exc:
            if exc.status != 404:
                raise
