"""Liveness, readiness and metrics: HTTP (/healthz /readyz /metrics) and gRPC Health v1.

Liveness is answered by the event loop itself: if the loop is stuck, nothing answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from plugin.health import HealthState
from plugin.logs import log

LIVENESS_SERVICE = "liveness"
READINESS_SERVICE = ""
# The whole request head, not each line: a client trickling bytes cannot hold a connection open.
HEADER_DEADLINE_S = 5.0


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
    """A minimal HTTP/1.1 server: GET only, one response per connection."""

    def __init__(self, health: HealthState, addr: str) -> None:
        self._health = health
        host, _, port = addr.rpartition(":")
        self._host = host.strip("[]") or "127.0.0.1"
        self._port = int(port)
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self._host, self._port)
        log("http_endpoints_listening", addr=f"{self._host}:{self.port}")

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

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
            return 200, CONTENT_TYPE_LATEST, generate_latest()
        return 404, "application/json", b'{"error": "not found"}'

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HEADER_DEADLINE_S):
                request_line = await reader.readline()
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
            parts = request_line.decode("latin-1").split()
            if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
                status, ctype, body = 405, "application/json", b'{"error": "GET only"}'
            else:
                status, ctype, body = self._route(parts[1].split("?", 1)[0])
            reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}.get(
                status, "Service Unavailable"
            )
            head = (
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + (body if parts and parts[0] != "HEAD" else b""))
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
