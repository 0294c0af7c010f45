"""Run the real plugin as a child process against a per-test node directory tree."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api import deviceplugin_pb2_grpc as pb_grpc
from tests.plugin.kubelet_stub import KubeletStub

KVM_RDEV = os.stat("/dev/kvm").st_rdev if os.path.exists("/dev/kvm") else 0


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.01
) -> Any:
    """Poll a condition until it holds; the error names the wait that expired."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"wait for {what} expired after {timeout}s")
        time.sleep(interval)


@dataclass
class Node:
    root: Path
    plugin_dir: Path = field(init=False)
    cdi_dir: Path = field(init=False)
    host_dev: Path = field(init=False)

    def __post_init__(self) -> None:
        self.plugin_dir = self.root / "device-plugins"
        self.cdi_dir = self.root / "cdi"
        self.host_dev = self.root / "host-dev"
        for d in (self.plugin_dir, self.cdi_dir, self.host_dev):
            d.mkdir(parents=True, exist_ok=True)
        os.mknod(self.host_dev / "kvm", 0o600 | 0o020000, KVM_RDEV)


class Stream:
    """One ListAndWatch stream consumed in a thread; snapshots land in `.snapshots`."""

    def __init__(self, socket: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        self.call = pb_grpc.DevicePluginStub(self.channel).ListAndWatch(pb.Empty())
        self.snapshots: list[list[tuple[str, str]]] = []
        self.ended = threading.Event()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            for msg in self.call:
                self.snapshots.append([(d.ID, d.health) for d in msg.devices])
        except grpc.RpcError:
            pass
        finally:
            self.ended.set()

    def healthy_count(self) -> int | None:
        if not self.snapshots:
            return None
        return sum(1 for _, h in self.snapshots[-1] if h == "Healthy")

    def cancel(self) -> None:
        self.call.cancel()
        self.ended.wait(5)
        self.channel.close()


class PluginProcess:
    def __init__(self, node: Node, kubelet: KubeletStub, *extra: str) -> None:
        self.node = node
        self.kubelet = kubelet
        self.log_path = node.root / "plugin.log"
        args = [
            sys.executable,
            "-m",
            "hv_device_plugin",
            "--device-plugin-dir",
            str(node.plugin_dir),
            "--cdi-dir",
            str(node.cdi_dir),
            "--host-dev-dir",
            str(node.host_dev),
            "--health-addr",
            "127.0.0.1:0",
            "--slots",
            "4",
            "--register-backoff-initial",
            "0.05",
            "--log-level",
            "debug",
            *extra,
        ]
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self._log)
        self.port = int(wait_for(self._http_port, 20, "plugin HTTP endpoints to listen"))

    def events(self) -> Iterator[dict[str, Any]]:
        for line in self.log_path.read_text().splitlines():
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue

    def _http_port(self) -> int | None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"plugin exited {self.proc.returncode}: {self.log_path.read_text()}")
        for ev in self.events():
            if ev.get("event") == "http_endpoints_listening":
                return int(str(ev["addr"]).rsplit(":", 1)[1])
        return None

    def http(self, path: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def ready(self) -> bool:
        return self.http("/readyz")[0] == 200

    def socket(self) -> Path:
        return self.node.plugin_dir / self.kubelet.registrations[-1].endpoint

    def stub(self) -> tuple[grpc.Channel, pb_grpc.DevicePluginStub]:
        channel = grpc.insecure_channel(f"unix:{self.socket()}")
        return channel, pb_grpc.DevicePluginStub(channel)

    def allocate(self, *ids: str) -> pb.AllocateResponse:
        channel, stub = self.stub()
        with channel:
            return stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]
                ),
                timeout=10,
            )

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode
