"""A real HTTPS API server on 127.0.0.1 for the DRA driver's few calls (hv_device_plugin.dra.kubeapi).

It serves ResourceClaims by namespace/name (GET) and ResourceSlices (GET, POST, PUT) from
in-memory objects, with a real certificate the driver's client verifies (its own CA file), so
the driver's KubeApi is judged as it is on a node: status codes, JSON bodies, TLS. A test can
make every claim read answer one status (`claim_status`) or a body without a UID (`claim_body`).
The live DRA checks judge the same client against a real API server.
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from hv_device_plugin.api.dra_wire import RESOURCE_API
from hv_device_plugin.dra.kubeapi import ApiAccess, KubeApi

_CLAIM = re.compile(rf"/apis/{re.escape(RESOURCE_API)}/namespaces/([^/]+)/resourceclaims/([^/]+)")
_SLICES = f"/apis/{RESOURCE_API}/resourceslices"


def make_cert(root: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA), and its key."""
    cert, key = root / "api.crt", root / "api.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
                    "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)  # fmt: skip
    return cert, key


class ApiStub:
    def __init__(self, root: Path) -> None:
        self.ca_file, key = make_cert(root)
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.slices: dict[str, dict[str, Any]] = {}
        self.claim_status = 0  # when set: every claim read answers this status
        self.claim_body: dict[str, Any] | None = None  # when set: every claim read answers it
        self.requests: list[str] = []  # "METHOD path", in order
        self.slice_writes = 0
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                stub._handle(self, "GET")

            def do_POST(self) -> None:
                stub._handle(self, "POST")

            def do_PUT(self) -> None:
                stub._handle(self, "PUT")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(self.ca_file, key)
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ApiStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def api(self) -> KubeApi:
        return KubeApi(ApiAccess(self.url, str(self.ca_file)))

    # -- the objects ---------------------------------------------------------------------

    def add_claim(self, name: str, results: list[dict[str, str]], uid: str = "") -> str:
        uid = uid or str(uuid.uuid4())
        with self.lock:
            self.claims[("ns", name)] = {
                "apiVersion": RESOURCE_API,
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "ns", "uid": uid},
                "status": {"allocation": {"devices": {"results": results}}},
            }
        return uid

    def delete_claim(self, name: str) -> None:
        with self.lock:
            del self.claims[("ns", name)]

    def claim_reads(self, name: str) -> int:
        with self.lock:
            return sum(1 for r in self.requests if r.startswith("GET ") and r.endswith(f"/{name}"))

    # -- HTTP ----------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = json.loads(h.rfile.read(length)) if length else None
        with self.lock:
            self.requests.append(f"{method} {h.path}")
            status, answer = self._answer(method, h.path, body)
        data = json.dumps(answer).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if m := _CLAIM.fullmatch(path):
            if self.claim_status:
                return self.claim_status, _status(self.claim_status, "injected")
            if self.claim_body is not None:
                return 200, self.claim_body
            claim = self.claims.get((m.group(1), m.group(2)))
            return (200, claim) if claim is not None else (404, _status(404, "not found"))
        if path.startswith(_SLICES):
            name = path[len(_SLICES) + 1 :]
            if method == "GET":
                found = self.slices.get(name)
                return (200, found) if found is not None else (404, _status(404, "not found"))
            self.slice_writes += 1
            obj = {
                **body,
                "metadata": {**body["metadata"], "resourceVersion": str(len(self.requests))},
            }
            self.slices[obj["metadata"]["name"]] = obj
            return (201 if method == "POST" else 200), obj
        return 404, _status(404, f"no such path {path}")


def _status(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "message": message}  # fmt: skip
