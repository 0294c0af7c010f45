"""Run a fixed-path plugin binary for real, in a private mount namespace, and watch it.

The fixture plugins hard-code /var/lib/kubelet/device-plugins, /var/run/cdi and /dev/kvm, as
third-party plugins do (a DaemonSet's hostPath volumes put the node's directories there). Here the
plugin runs under `unshare -m --propagation private`: tmpfs over /var/lib and over the directory
/var/run resolves to, then the test's own temp dirs bind-mounted at the fixed paths. Nothing is
created on the host's /var/lib or /run, and every mount dies with the plugin's namespace.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from asyncinotify import Inotify, Mask
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api import deviceplugin_pb2_grpc as pb_grpc
from tests.plugin.kubelet_stub import KubeletStub

# $1 plugin dir, $2 CDI dir, $3 a file to bind over /dev/kvm ("" for the real device), then argv.
NAMESPACE_SETUP = r"""
set -eu
mount -t tmpfs -o mode=0755 fixture-var-lib /var/lib
mkdir -p /var/lib/kubelet/device-plugins
mount --bind "$1" /var/lib/kubelet/device-plugins
run=$(readlink -f /var/run)
mount -t tmpfs -o mode=0755 fixture-run "$run"
mkdir "$run/cdi"
mount --bind "$2" "$run/cdi"
if [ -n "$3" ]; then mount --bind "$3" /dev/kvm; fi
shift 3
exec "$@"
"""

_DIR_EVENTS = (
    Mask.CREATE | Mask.DELETE | Mask.MOVED_TO | Mask.MOVED_FROM | Mask.CLOSE_WRITE | Mask.ATTRIB
)


def wait_in_dir(directory: Path, done: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait until done() holds, re-checking on each inotify event in directory (deadline)."""
    deadline = time.monotonic() + timeout
    with Inotify() as ino:
        ino.add_watch(directory, _DIR_EVENTS)  # before the first check: no wake-up is lost
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"wait for {what} expired after {timeout}s")
            ino.sync_timeout = remaining
            ino.sync_get()


class Stream:
    """A ListAndWatch stream read in a thread; waits are condition-driven with deadlines."""

    def __init__(self, socket: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        self.call = pb_grpc.DevicePluginStub(self.channel).ListAndWatch(pb.Empty())
        self.snapshots: list[list[tuple[str, str]]] = []
        self.ended = False
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        try:
            for msg in self.call:
                with self._cond:
                    self.snapshots.append([(d.ID, d.health) for d in msg.devices])
                    self._cond.notify_all()
        except grpc.RpcError:
            pass
        finally:
            with self._cond:
                self.ended = True
                self._cond.notify_all()

    def wait(
        self, want: Callable[[list[tuple[str, str]]], bool], timeout: float, what: str
    ) -> None:
        with self._cond:
            ok = self._cond.wait_for(
                lambda: bool(self.snapshots) and want(self.snapshots[-1]), timeout
            )
            if not ok:
                raise TimeoutError(f"stream: {what} not seen in {timeout}s: {self.snapshots[-3:]}")

    def wait_ended(self, timeout: float) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self.ended, timeout):
                raise TimeoutError(f"stream did not end in {timeout}s")

    def close(self) -> None:
        self.channel.close()  # cancels the stream too


def all_health(health: str) -> Callable[[list[tuple[str, str]]], bool]:
    return lambda devs: len(devs) > 0 and all(h == health for _, h in devs)


class FixturePlugin:
    """One plugin process in its own mount namespace, talking to a kubelet stub."""

    def __init__(
        self,
        binary: Path,
        root: Path,
        kubelet: KubeletStub,
        env: dict[str, str] | None = None,
        dev_override: str = "",
        argv: tuple[str, ...] = ("-v=2",),
    ) -> None:
        self.root, self.kubelet = root, kubelet
        self.plugin_dir, self.cdi_dir = root / "device-plugins", root / "cdi"
        self.plugin_dir.mkdir(exist_ok=True)
        self.cdi_dir.mkdir(exist_ok=True)
        self.log_path = root / "plugin.log"
        self._log = self.log_path.open("wb")
        args = ["unshare", "-m", "--propagation", "private", "sh", "-c", NAMESPACE_SETUP]
        args += ["fixture-ns", str(self.plugin_dir), str(self.cdi_dir), dev_override]
        # unshare and sh both exec: the child's pid is the plugin's pid, signals reach it directly.
        self.proc = subprocess.Popen(
            [*args, str(binary), *argv],
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def socket(self) -> Path:
        return self.plugin_dir / self.kubelet.registrations[-1].endpoint

    def allocate(self, *ids: str) -> pb.AllocateResponse:
        with grpc.insecure_channel(f"unix:{self.socket()}") as ch:
            request = pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids))]
            )
            return pb_grpc.DevicePluginStub(ch).Allocate(request, timeout=10)

    def health(self, service: str) -> str:
        """The gRPC Health status name, or the RPC error code name when the call fails."""
        with grpc.insecure_channel(f"unix:{self.socket()}") as ch:
            try:
                resp = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=5
                )
            except grpc.RpcError as exc:
                return str(exc.code().name)
            return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))

    def wait_health(self, service: str, want: str, timeout: float) -> None:
        """Watch (server-streamed Health) until the status is `want`, with a deadline."""
        with grpc.insecure_channel(f"unix:{self.socket()}") as ch:
            stream = health_pb2_grpc.HealthStub(ch).Watch(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
            seen = []
            try:
                for resp in stream:
                    seen.append(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))
                    if seen[-1] == want:
                        return
            except grpc.RpcError as exc:
                raise TimeoutError(f"health {service!r}: {want} not seen ({seen}): {exc}") from exc
            finally:
                stream.cancel()

    def wait_exit(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after 15 s; the mount namespace dies with the process."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ValueError(f"no VmRSS for pid {pid}")


def nsenter_mount(pid: int, *cmd: str) -> None:
    """Run a command in the plugin's mount namespace (to change what it sees at a fixed path)."""
    subprocess.run(["nsenter", f"--mount=/proc/{pid}/ns/mnt", *cmd], check=True, timeout=10)
