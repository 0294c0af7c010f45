"""A minimal kubelet Registration server for plugin tests: records every Register call.

On each Register it dials the plugin's endpoint and calls GetDevicePluginOptions at once, as the
real kubelet does since 1.25, so a plugin that registers before serving fails here too.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api import deviceplugin_pb2_grpc as pb_grpc


@dataclass
class Registration:
    at: float
    endpoint: str
    resource_name: str
    version: str
    serving: bool
    error: str


class KubeletStub(pb_grpc.RegistrationServicer):
    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.registrations: list[Registration] = []
        self._cond = threading.Condition()
        self._server: grpc.Server | None = None
        self.started_at = 0.0

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        serving, error = True, ""
        try:
            with grpc.insecure_channel(f"unix:{self.plugin_dir / request.endpoint}") as ch:
                pb_grpc.DevicePluginStub(ch).GetDevicePluginOptions(pb.Empty(), timeout=2)
        except grpc.RpcError as exc:
            serving, error = False, f"{exc.code().name}: {exc.details()}"
        with self._cond:
            self.registrations.append(
                Registration(
                    time.monotonic(),
                    request.endpoint,
                    request.resource_name,
                    request.version,
                    serving,
                    error,
                )
            )
            self._cond.notify_all()
        if not serving:
            context.abort(grpc.StatusCode.UNKNOWN, f"failed to dial device plugin: {error}")
        return pb.Empty()

    def start(self, at: Path | None = None) -> None:
        """Serve Registration at the plugin dir's kubelet.sock, or at `at` (a test in front)."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix:{at or self.plugin_dir / 'kubelet.sock'}")
        server.start()
        self._server = server
        self.started_at = time.monotonic()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def restart(self) -> float:
        """Stop, remove every socket as the kubelet does at start-up, start; return start time."""
        self.stop()
        for entry in self.plugin_dir.iterdir():
            if entry.is_socket():
                entry.unlink()
        self.start()
        return self.started_at

    def wait_registrations(self, count: int, timeout: float) -> list[Registration]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.registrations) >= count, timeout):
                raise TimeoutError(
                    f"wait for {count} registration(s) expired after {timeout}s "
                    f"(saw {len(self.registrations)})"
                )
            return list(self.registrations)

    def wait_serving_after(self, after: float, timeout: float) -> Registration:
        """The first successful registration that arrived after `after` (monotonic)."""

        def found() -> Registration | None:
            return next((r for r in self.registrations if r.at > after and r.serving), None)

        with self._cond:
            if not self._cond.wait_for(lambda: found() is not None, timeout):
                raise TimeoutError(
                    f"wait for a successful registration expired after {timeout}s "
                    f"(attempts seen: {[r.error or 'ok' for r in self.registrations if r.at > after]})"
                )
            reg = found()
            assert reg is not None
            return reg
