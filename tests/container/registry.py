"""A container registry on loopback for the push steps: the push half of the OCI distribution
API, enough for dockerd's `docker push` (blob uploads, monolithic or chunked, and manifests).

Real bytes, real digests: a blob whose content does not hash to the digest it is pushed under is
refused, and a manifest's digest is the SHA-256 of the bytes received, as a registry computes
it. dockerd treats 127.0.0.0/8 as an insecure registry by default, so no TLS is needed.
"""

from __future__ import annotations

import hashlib
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

_NAME = r"(?P<name>[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
_BLOB = re.compile(rf"^/v2/{_NAME}/blobs/(?P<digest>sha256:[0-9a-f]{{64}})$")
_UPLOADS = re.compile(rf"^/v2/{_NAME}/blobs/uploads/$")
_UPLOAD = re.compile(rf"^/v2/{_NAME}/blobs/uploads/(?P<id>[0-9a-f]{{32}})$")
_MANIFEST = re.compile(rf"^/v2/{_NAME}/manifests/(?P<ref>[A-Za-z0-9_.:-]+)$")


class Registry:
    """Blobs and manifests in a directory; `manifests[(name, ref)]` -> (digest, media type)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs"
        self.uploads = root / "uploads"
        self.blobs.mkdir(parents=True)
        self.uploads.mkdir()
        self.manifests: dict[tuple[str, str], tuple[str, str]] = {}
        self.lock = threading.Lock()

    def blob_path(self, digest: str) -> Path:
        return self.blobs / digest.replace(":", "-")

    def manifest_digest(self, name: str, ref: str) -> str | None:
        with self.lock:
            found = self.manifests.get((name, ref))
        return found[0] if found else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass  # dockerd is chatty; failures show in the test's assertion instead

    def _reply(self, code: int, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.send_response(code)
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _body(self) -> bytes:
        """The request body: Content-Length or chunked (Go's client streams layers chunked)."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self) -> None:
        self._get_or_head()

    def do_HEAD(self) -> None:
        self._get_or_head()

    def _get_or_head(self) -> None:
        reg = self.server.registry
        path = urlsplit(self.path).path
        if path == "/v2/":
            return self._reply(200, {"Content-Type": "application/json"}, b"{}")
        if m := _BLOB.match(path):
            blob = reg.blob_path(m["digest"])
            if blob.exists():
                data = blob.read_bytes()
                return self._reply(200, {"Docker-Content-Digest": m["digest"]}, data)
        if m := _MANIFEST.match(path):
            digest = reg.manifest_digest(m["name"], m["ref"])
            if digest:
                data = reg.blob_path(digest).read_bytes()
                media = reg.manifests[(m["name"], m["ref"])][1]
                headers = {"Docker-Content-Digest": digest, "Content-Type": media}
                return self._reply(200, headers, data)
        return self._reply(404, {"Content-Type": "application/json"}, b'{"errors": []}')

    def _new_upload(self, name: str) -> None:
        upload = uuid.uuid4().hex
        (self.server.registry.uploads / upload).write_bytes(b"")
        self._reply(202, {"Location": f"/v2/{name}/blobs/uploads/{upload}",
                          "Docker-Upload-UUID": upload, "Range": "0-0"})  # fmt: skip

    def do_POST(self) -> None:
        self._body()
        if m := _UPLOADS.match(urlsplit(self.path).path):
            return self._new_upload(m["name"])  # a cross-repository mount is just a new upload
        return self._reply(404)

    def do_PATCH(self) -> None:
        data = self._body()
        m = _UPLOAD.match(urlsplit(self.path).path)
        part = self.server.registry.uploads / m["id"] if m else None
        if m is None or part is None or not part.exists():
            return self._reply(404)
        with part.open("ab") as fh:
            fh.write(data)
        size = part.stat().st_size
        self._reply(202, {"Location": f"/v2/{m['name']}/blobs/uploads/{m['id']}",
                          "Docker-Upload-UUID": m["id"], "Range": f"0-{max(size - 1, 0)}"})  # fmt: skip

    def do_PUT(self) -> None:
        reg = self.server.registry
        data = self._body()
        url = urlsplit(self.path)
        if m := _UPLOAD.match(url.path):
            part = reg.uploads / m["id"]
            want = parse_qs(url.query).get("digest", [""])[0]
            if not part.exists():
                return self._reply(404)
            content = part.read_bytes() + data
            part.unlink()
            if want != "sha256:" + hashlib.sha256(content).hexdigest():
                return self._reply(400, {"Content-Type": "application/json"}, b"digest mismatch")
            reg.blob_path(want).write_bytes(content)
            return self._reply(201, {"Location": f"/v2/{m['name']}/blobs/{want}",
                                     "Docker-Content-Digest": want})  # fmt: skip
        if m := _MANIFEST.match(url.path):
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            reg.blob_path(digest).write_bytes(data)
            media = self.headers.get("Content-Type", "application/octet-stream")
            with reg.lock:
                reg.manifests[(m["name"], m["ref"])] = (digest, media)
                reg.manifests[(m["name"], digest)] = (digest, media)
            return self._reply(201, {"Location": f"/v2/{m['name']}/manifests/{digest}",
                                     "Docker-Content-Digest": digest})  # fmt: skip
        return self._reply(404)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: Registry


@contextmanager
def serve(root: Path) -> Iterator[tuple[str, Registry]]:
    """A registry on 127.0.0.1 (an ephemeral port): yields its host:port and its state."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.registry = Registry(root)
    thread = threading.Thread(target=server.serve_forever, name="registry", daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", server.registry
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
