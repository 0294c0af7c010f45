"""The two kubelets of the differential test, behind one small interface.

`EmulatorSide`: hvconform.kubelet's emulator on a temporary plugin dir. `RealSide`: the real
kubelet of the node stack (`nox -s node-up`), observed through the Node's status and pods. A
`PluginThread` runs the test suite's MinimalPlugin (tests/conformance/minimal_plugin.py) on its
own event loop, so both sides talk to the very same plugin code and its recorded calls.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from hvconform.kubelet import ThreadedKubeletEmulator
from hvconform.targets.realnode import CDI_DIR, NODE_NAME, PLUGIN_DIR, RUN, procs, stack
from hvconform.targets.realnode.configs import NAMESPACE, workload_pod
from hvconform.targets.realnode.kubeapi import Api, ApiError, quantity
from hvconform.targets.realnode.reboot import kubelet_plugin_fds, shut_down_in
from tests.conformance.minimal_plugin import Faults, MinimalPlugin

T = TypeVar("T")


@dataclass(frozen=True)
class Admission:
    phase: str  # "Running" when admitted (real) / "" (emulator ok), "Failed" when refused
    reason: str
    message: str


class Side(Protocol):
    name: str
    plugin_dir: Path

    def counts(self, resource: str) -> tuple[int, int]: ...  # (capacity, allocatable)
    def admit(self, resource: str) -> Admission: ...
    def restart_kubelet(self, graceful: bool) -> None: ...
    def end_stream(self, resource: str, socket: Path) -> None: ...  # ended by the kubelet
    def release_all(self) -> None: ...
    def close(self) -> None: ...


class EmulatorSide:
    name = "emulator"

    def __init__(self, root: Path) -> None:
        self.plugin_dir = root / "device-plugins"
        self.plugin_dir.mkdir(parents=True)
        self.kubelet = ThreadedKubeletEmulator(self.plugin_dir)
        self.kubelet.start()
        self._records: list[Any] = []

    def counts(self, resource: str) -> tuple[int, int]:
        return self.kubelet.capacity(resource), self.kubelet.allocatable(resource)

    def admit(self, resource: str) -> Admission:
        outcome = self.kubelet.allocate(resource, 1)
        if outcome.allocation is not None:
            self._records.append(outcome.allocation)
        return Admission(
            "Running" if outcome.ok else outcome.phase, outcome.reason, outcome.message
        )

    def restart_kubelet(self, graceful: bool) -> None:
        self.kubelet.restart(graceful)

    def end_stream(self, resource: str, socket: Path) -> None:
        self.kubelet.end_stream(resource)

    def release_all(self) -> None:
        for record in self._records:
            self.kubelet.release(record)
        self._records.clear()

    def close(self) -> None:
        self.kubelet.stop()


class RealSide:
    name = "kubelet"

    def __init__(self, pki: Path) -> None:
        self.plugin_dir = PLUGIN_DIR
        self.api = Api(pki)
        self.state = RUN / "workloads"
        self.state.mkdir(parents=True, exist_ok=True)
        self._pods: list[str] = []
        node = self.api.get(f"/api/v1/nodes/{NODE_NAME}")
        self.version = str(node["status"]["nodeInfo"]["kubeletVersion"])

    def counts(self, resource: str) -> tuple[int, int]:
        status = self.api.get(f"/api/v1/nodes/{NODE_NAME}")["status"]
        return (
            quantity(status.get("capacity", {}).get(resource, "0")),
            quantity(status.get("allocatable", {}).get(resource, "0")),
        )

    def _pod(self, name: str) -> dict[str, Any] | None:
        try:
            pod: dict[str, Any] = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return pod

    def admit(self, resource: str) -> Admission:
        name = f"hvdiff-{uuid.uuid4().hex[:8]}"
        pod = workload_pod(name, resource, ["/pause"], self.state)
        self.api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
        self._pods.append(name)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = (self._pod(name) or {}).get("status", {})
            if status.get("phase") in ("Running", "Failed"):
                return Admission(
                    status["phase"], status.get("reason", ""), status.get("message", "")
                )
            time.sleep(0.1)
        raise TimeoutError(f"pod {name} neither Running nor Failed after 60 s")

    def restart_kubelet(self, graceful: bool) -> None:
        kubelet = procs.recorded("kubelet")
        assert kubelet is not None, "the real node's kubelet is not running"
        kubelet.stop(sig=signal.SIGTERM if graceful else signal.SIGKILL)
        stack.start_kubelet(self.api)

    def end_stream(self, resource: str, socket: Path) -> None:
        """The kubelet's connection to the plugin's socket shut down from the kubelet's side
        (as the node target's stream-lost check makes it)."""
        kubelet = procs.recorded("kubelet")
        assert kubelet is not None, "the real node's kubelet is not running"
        fds = kubelet_plugin_fds(kubelet.pid, str(socket.parent), socket.name)
        assert fds, f"the kubelet holds no connection to {socket}"
        for fd in fds:
            shut_down_in(kubelet.pid, fd)

    def release_all(self) -> None:
        for name in self._pods:
            try:
                self.api.request(
                    "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}?gracePeriodSeconds=0"
                )
            except ApiError as exc:
                if exc.status != 404:
                    raise
        deadline = time.monotonic() + 60
        while any(self._pod(n) is not None for n in self._pods):
            if time.monotonic() > deadline:
                raise TimeoutError(f"pods {self._pods} not deleted after 60 s")
            time.sleep(0.2)
        self._pods.clear()

    def close(self) -> None:
        self.release_all()


def write_cdi_spec(resource: str, count: int) -> Path:
    """CDI devices named like MinimalPlugin's answers, so real containers can start."""
    spec = {
        "cdiVersion": "0.5.0",
        "kind": resource,
        "devices": [
            {"name": f"dev-{i}", "containerEdits": {"env": [f"HVDIFF_DEVICE=dev-{i}"]}}
            for i in range(count)
        ],
    }
    path = CDI_DIR / f"hvdiff-{resource.replace('/', '-')}.json"
    path.write_text(json.dumps(spec))
    return path


class PluginThread:
    """A MinimalPlugin on its own event loop thread; `call` runs a coroutine there."""

    def __init__(
        self, plugin_dir: Path, resource: str, *, faults: Faults | None = None, **kwargs: Any
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        sock = f"hvdiff-{uuid.uuid4().hex[:6]}.sock"
        self.plugin = self.call(
            lambda: _make(plugin_dir, resource, sock, faults or Faults(), kwargs)
        )

    def call(self, factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(factory(), self.loop)
        return future.result(60)

    def sync(self, fn: Callable[[], None]) -> None:
        """Run a plain method of the plugin on its loop (queues are not thread-safe)."""

        async def run() -> None:
            fn()

        self.call(run)

    def close(self) -> None:
        self.call(self.plugin.stop)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


async def _make(
    plugin_dir: Path, resource: str, sock: str, faults: Faults, kwargs: dict[str, Any]
) -> MinimalPlugin:
    plugin = MinimalPlugin(plugin_dir, resource, socket_name=sock, faults=faults, **kwargs)
    await plugin.start()
    return plugin


def settle(
    side: Side, resource: str, expected: tuple[int, int], timeout_s: float = 20.0
) -> tuple[int, int]:
    """Poll until the counts equal `expected` or the timeout; return what was last seen."""
    deadline = time.monotonic() + timeout_s
    seen = side.counts(resource)
    while seen != expected and time.monotonic() < deadline:
        time.sleep(0.1)
        seen = side.counts(resource)
    return seen
