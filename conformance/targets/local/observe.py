"""Observe a sandboxed plugin's health the way its profile says a kubelet probe would.

`http` GETs a URL across the veth from the root namespace (never through a proxy); `grpc-health`
asks grpc.health.v1 on the plugin's own socket (the endpoint it registered, in the node's plugin
dir); `exec` runs a command in the plugin's namespaces, as a Kubernetes exec probe does; `none`
cannot be observed (callers check `observable` first and judge on what the kubelet sees).
"""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hvconform.contract.plugin import PluginUnderTest, Probe


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A probe answers itself: a redirect is not followed (it could point off the plugin's own
    address, which the profile rules keep the probe on), it reads as not healthy."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
PROBE_TIMEOUT_S = 2.0


class Observer:
    """Answers one probe of one plugin; cheap to call in a polling loop."""

    def __init__(
        self,
        plugin: PluginUnderTest,
        probe: Probe,
        *,
        health_addr: Callable[[], str],
        socket: Callable[[], Path | None],
        pid: Callable[[], int],
    ) -> None:
        self.plugin = plugin
        self.probe = probe
        self._health_addr = health_addr
        self._socket = socket
        self._pid = pid

    @property
    def observable(self) -> bool:
        return self.probe.observable

    def __call__(self) -> bool:
        kind = self.probe.type
        if kind == "http":
            return self._http()
        if kind == "grpc-health":
            return self._grpc()
        if kind == "exec":
            return self._exec()
        return False

    def _http(self) -> bool:
        url = self.plugin.fill(self.probe.url, self._health_addr())
        try:
            with _NO_PROXY.open(url, timeout=PROBE_TIMEOUT_S) as resp:
                return 200 <= int(resp.status) < 400
        except urllib.error.HTTPError:
            return False
        except (OSError, ValueError):
            return False

    def _grpc(self) -> bool:
        sock = self._socket()
        if sock is None or not sock.exists():
            return False
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                answer = stub.Check(
                    health_pb2.HealthCheckRequest(service=self.probe.service),
                    timeout=PROBE_TIMEOUT_S,
                )
            except grpc.RpcError:
                return False
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

    def _exec(self) -> bool:
        argv = [self.plugin.fill(a, self._health_addr()) for a in self.probe.command]
        # The plugin's mount and network namespaces and its root (-r): what `kubectl exec` sees.
        cmd = ["nsenter", "-t", str(self._pid()), "-m", "-n", "-r", "-w", "--", *argv]
        try:
            done = subprocess.run(
                cmd, capture_output=True, timeout=PROBE_TIMEOUT_S * 5, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0
