"""Liveness, readiness and metrics: HTTP (/healthz /readyz /metrics) and gRPC Health v1.

Liveness is answered by the event loop itself: if the loop is stuck, nothing answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hv_device_plugin import metrics
from hv_device_plugin.health import HealthState
from hv_device_plugin.logs import log, warn

LIVENESS_SERVICE = "liveness"
READINESS_SERVICE = ""
# The whole request head, not each line: a client trickling bytes cannot hold a connection open.
HEADER_DEADLINE_S = 5.0
# Request line plus headers. Probes and Prometheus send a few hundred bytes; a larger head is
# answered 431 (Request Header Fields Too Large) and logged as one JSON line.
MAX_HEAD_BYTES = 16 * 1024
READ_CHUNK = 4096
# After a 431, what the client still sends is read and dropped, up to these bounds.
MAX_DISCARD_BYTES = 1 << 20
DISCARD_DEADLINE_S = 1.0
_TOO_LARGE = b'{"error": "request head too large"}'
_REASONS = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
}


class GrpcHealth(health_pb2_grpc.HealthServicer):  # type: ignore[misc]  # untyped base
    """Standard gRPC Health v1 on the plugin socket: "liveness" and "" (readiness)."""

    def __init__(self, health: HealthState) -> None:
        self._health = health

    async def Check(
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> health_pb2.HealthCheckResponse:
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        if request.service == LIVENESS_SERVICE:
            return health_pb2.HealthCheckResponse(status=serving)
        if request.service == READINESS_SERVICE:
            status = serving if self._health.ready else not_serving
            return health_pb2.HealthCheckResponse(status=status)
        await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        raise AssertionError("unreachable")


def liveness_report(health: HealthState) -> dict[str, object]:
    return {"alive": True, "shutting_down": health.shutting_down}


class HttpEndpoints:
    """A minimal HTTP/1.1 server: GET only, one response per connection, bounded request head."""

    def __init__(self, health: HealthState, listener: socket.socket) -> None:
        self._health = health
        self._listener = listener
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    async def start(self) -> None:
        # The socket was bound and is listening since the configuration was checked.
        self._server = await asyncio.start_server(self._handle, sock=self._listener)
        host = self._listener.getsockname()[0]
        where = f"[{host}]" if self._listener.family == socket.AF_INET6 else host
        log("http_endpoints_listening", addr=f"{where}:{self.port}")

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        else:
            self._listener.close()

    def _route(self, path: str) -> tuple[int, str, bytes]:
        if path == "/healthz":
            body = json.dumps(liveness_report(self._health)).encode()
            return 200, "application/json", body
        if path == "/readyz":
            report = self._health.readiness_report()
            return (
                (200 if report["ready"] else 503),
                "application/json",
                json.dumps(report).encode(),
            )
        if path == "/metrics":
            return 200, metrics.CONTENT_TYPE, metrics.exposition()
        return 404, "application/json", b'{"error": "not found"}'

    def _answer(self, head: bytes) -> tuple[int, str, bytes, bool]:
        parts = head.split(b"\n", 1)[0].decode("latin-1").split()
        if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
            return 405, "application/json", b'{"error": "GET only"}', True
        status, ctype, body = self._route(parts[1].split("?", 1)[0])
        return status, ctype, body, parts[0] != "HEAD"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HEADER_DEADLINE_S):
                head = await _read_head(reader)
            if head is None:
                status, ctype, body, send = 431, "application/json", _TOO_LARGE, True
                peer = writer.get_extra_info("peername")
                warn(
                    "http_request_refused",
                    status=431,
                    reason=f"request line and headers over {MAX_HEAD_BYTES} bytes",
                    peer=str(peer[0]) if isinstance(peer, tuple) else "",
                )
            else:
                status, ctype, body, send = self._answer(head)
            reply = (
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Service Unavailable')}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(reply.encode() + (body if send else b""))
            await writer.drain()
            if head is None:
                await _discard_rest(reader, writer)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    """The request line and headers (up to the blank line), or None when over the bound."""
    head = b""
    while True:
        ends = [i for i in (head.find(b"\r\n\r\n"), head.find(b"\n\n")) if i >= 0]
        end = min(ends) if ends else len(head)
        if end > MAX_HEAD_BYTES:
            return None
        if ends:
            return head[:end]
        chunk = await reader.read(READ_CHUNK)
        if not chunk:
            return head  # the client stopped sending: answer what arrived
        head += chunk


async def _discard_rest(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read what the client is still sending, bounded, before closing: closing a socket with
    unread data sends a reset, which can destroy the 431 before the client has read it."""
    if writer.can_write_eof():
        writer.write_eof()
    left = MAX_DISCARD_BYTES
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(DISCARD_DEADLINE_S):
            while left > 0 and (chunk := await reader.read(READ_CHUNK)):
                left -= len(chunk)
