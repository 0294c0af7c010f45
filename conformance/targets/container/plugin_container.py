"""The plugin as a hardened container under the Docker engine, driven through testcontainers.

What a DaemonSet pod of the plugin gets: every capability dropped, no-new-privileges, a
read-only root filesystem (a small tmpfs on /tmp), no network (`--network none`), the hypervisor
device passed explicitly (`--device /dev/kvm:/dev/kvm:rw`, the path the bootstrap device-access
plugin grants: rw, never m), and hostPath-like bind mounts of the node's plugin, CDI and
host-device dirs at the same paths with rslave propagation (HostToContainer).

Probes: with no network the harness reaches /healthz and /readyz through the container's network
namespace: a short-lived thread setns()es into /proc/<pid>/ns/net and connects to the plugin's
127.0.0.1 port there; the socket stays in that namespace, the request is made from the harness
(nsenter -n without a process per probe). The kubelet-style exec probe
(`hv-device-plugin probe readiness`) is run through `docker exec` as well, as evidence.
testcontainers runs without its reaper (Ryuk): that is an image to pull and no registry exists;
the ledger and close() do its job.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import socket
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testcontainers.core.config import testcontainers_config
from testcontainers.core.container import DockerContainer

from conformance.contract.ledger import Ledger
from conformance.targets.container.engine import DATA_ROOT
from conformance.targets.local.procs import mount_points, proc_status

# TESTCONTAINERS_RYUK_DISABLED=true, forced rather than defaulted: the reaper is an image that
# would be pulled from a registry, and none exists here.
testcontainers_config.ryuk_disabled = True

CLONE_NEWNET = 0x40000000
CAP_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
STOP_GRACE_S = 15


class PluginContainerError(RuntimeError):
    """The plugin container could not be started, reached or removed."""


def netns_connect(pid: int, host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection made from inside the network namespace of process `pid`."""
    result: dict[str, Any] = {}

    def enter_and_connect() -> None:
        # setns(CLONE_NEWNET) changes only the calling thread; this thread ends right after.
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into netns of {pid}")
            finally:
                os.close(fd)
            result["sock"] = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            result["error"] = exc

    thread = threading.Thread(target=enter_and_connect, name=f"netns-{pid}", daemon=True)
    thread.start()
    thread.join(timeout + 5)
    if "sock" in result:
        sock: socket.socket = result["sock"]
        return sock
    raise result.get("error") or TimeoutError(f"connect in netns of {pid} timed out")


class PluginContainer:
    """One plugin container at a time; restart() replaces it, as a pod replacement does."""

    def __init__(
        self,
        *,
        host: str,
        image: str,
        argv: Sequence[str],
        binds: Sequence[Path],
        ledger: Ledger,
        name: str,
        log_path: Path,
        health_port: int,
        entrypoint: Sequence[str] = (),
        device: str = "/dev/kvm",
    ) -> None:
        self.host = host
        self.image = image
        self.argv = list(argv)
        self.binds = list(binds)
        self.ledger = ledger
        self.base_name = name
        self.log_path = log_path
        self.health_port = health_port
        self.entrypoint = list(entrypoint)
        self.device = device
        self.generation = 0
        self.records: list[dict[str, Any]] = []  # one per container: id, image, inspection
        self._tc: DockerContainer | None = None
        self._pid = 0

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return f"{self.base_name}-{self.generation}"

    def start(self) -> int:
        """Create and start a container; returns the plugin's host pid."""
        if self._tc is not None:
            raise PluginContainerError(f"{self.name} is already running")
        self.generation += 1
        tc = DockerContainer(
            self.image, docker_client_kw={"environment": {"DOCKER_HOST": self.host}}
        )
        tc.with_name(self.name).with_command(self.argv)
        for path in self.binds:
            tc.with_volume_mapping(str(path), str(path), "rw,rslave")
        # testcontainers passes this string through as the tmpfs mount options.
        tc.with_tmpfs_mount("/tmp", "size=16m,mode=1777")
        tc.with_kwargs(
            cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True,
            network_mode="none", devices=[f"{self.device}:{self.device}:rw"],
            stop_signal="SIGTERM",
            labels={"dev.hyperlight.hv.role": "plugin-under-test"},
            **({"entrypoint": self.entrypoint} if self.entrypoint else {}),
        )  # fmt: skip
        self.ledger.record("container", f"docker:{self.name}", self._ledger_detail())
        self._tc = tc
        try:
            tc.start()
        except Exception as exc:
            self._remove()
            raise PluginContainerError(f"starting {self.name} from {self.image}: {exc}") from exc
        wrapped = tc.get_wrapped_container()
        wrapped.reload()
        self._pid = int(wrapped.attrs["State"]["Pid"])
        if not self._pid:
            self._remove()
            raise PluginContainerError(f"{self.name} exited at once:\n{self.log_tail()}")
        self.ledger.record_process(self._pid, f"plugin in container {self.name}")
        self.records.append(self._inspect())
        return self._pid

    def _ledger_detail(self) -> str:
        return f"host={self.host} data_root={DATA_ROOT}; plugin container"

    def stop(self) -> None:
        """SIGTERM with a grace period (SIGKILL after it), keep the logs, remove."""
        if self._tc is None:
            return
        wrapped = self._tc.get_wrapped_container()
        try:
            wrapped.stop(timeout=STOP_GRACE_S)
            wrapped.reload()
            self.records[-1]["exit_code"] = wrapped.attrs["State"]["ExitCode"]
        finally:
            self._remove()

    def _remove(self) -> None:
        tc, self._tc, self._pid = self._tc, None, 0
        if tc is None:
            return
        # A container that never started has no logs.
        with contextlib.suppress(Exception), self.log_path.open("ab") as fh:
            fh.write(tc.get_wrapped_container().logs())
        tc.stop()  # testcontainers: remove(force=True) and close the client

    def restart(self) -> int:
        """Replace the container (stop, remove, start a new one); returns the new pid."""
        self.stop()
        return self.start()

    # -- observation ------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        if not self._pid:
            raise PluginContainerError("no plugin container running")
        return self._pid

    @property
    def container_id(self) -> str:
        if self._tc is None:
            raise PluginContainerError("no plugin container running")
        return str(self._tc.get_wrapped_container().id)

    @property
    def running(self) -> bool:
        if self._tc is None:
            return False
        wrapped = self._tc.get_wrapped_container()
        try:
            wrapped.reload()
        except Exception:
            return False
        return bool(wrapped.attrs["State"]["Running"])

    def http_get(self, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
        """GET http://127.0.0.1:<port><path> inside the container's network namespace."""
        sock = netns_connect(self.pid, "127.0.0.1", self.health_port, timeout)
        conn = http.client.HTTPConnection("127.0.0.1", self.health_port, timeout=timeout)
        conn.sock = sock
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def exec_probe(self, kind: str, *args: str) -> tuple[int, str]:
        """`hv-device-plugin probe <kind> ARGS` in the container: a kubelet exec probe."""
        if self._tc is None:
            raise PluginContainerError("no plugin container running")
        result = self._tc.exec(["hv-device-plugin", "probe", kind, *args])
        code = -1 if result.exit_code is None else int(result.exit_code)
        return code, bytes(result.output or b"").decode(errors="replace")

    def capabilities(self) -> dict[str, int]:
        """Capability sets and NoNewPrivs of the plugin, from /proc/<pid>/status."""
        status = proc_status(self.pid)
        caps = {key: int(status[key], 16) for key in CAP_FIELDS}
        return {**caps, "NoNewPrivs": int(status["NoNewPrivs"])}

    def _inspect(self) -> dict[str, Any]:
        assert self._tc is not None
        attrs = self._tc.get_wrapped_container().attrs
        hc = attrs["HostConfig"]
        return {
            "name": self.name,
            "id": attrs["Id"],
            "image_id": attrs["Image"],
            "image": self.image,
            "pid": self._pid,
            **self.capabilities(),
            "cap_drop": hc.get("CapDrop"),
            "security_opt": hc.get("SecurityOpt"),
            "read_only_rootfs": hc.get("ReadonlyRootfs"),
            "network_mode": hc.get("NetworkMode"),
            "devices": [f"{d['PathOnHost']}:{d['PathInContainer']}:{d['CgroupPermissions']}"
                        for d in hc.get("Devices") or []],
            "binds": hc.get("Binds"),
            "privileged": hc.get("Privileged"),
        }  # fmt: skip

    def log_tail(self, lines: int = 50) -> str:
        """End of the plugin's output: earlier containers' logs, then the running one's."""
        text = self.log_path.read_bytes() if self.log_path.exists() else b""
        if self._tc is not None:
            with contextlib.suppress(Exception):  # a gone container has no more logs to add
                text += self._tc.get_wrapped_container().logs(tail=lines)
        return "\n".join(text.decode(errors="replace").splitlines()[-lines:])

    # -- faults inside the plugin's mount namespace ---------------------------------------

    def in_mount_ns(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """Run argv (the container's own binary) in the plugin's mount namespace as root.

        The pid namespace is joined too: the container's /proc belongs to it, and umount reads
        /proc/self/mountinfo, which does not resolve for a process outside it.
        """
        cmd = ["nsenter", "-t", str(self.pid), "-m", "-p", "--", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)

    def mount(self, args: Sequence[str], target: Path) -> None:
        """`mount ARGS TARGET` in the plugin's namespace only; verified in its mountinfo."""
        before = mount_points(self.pid).count(str(target))
        self.ledger.record("mount", str(target), "plugin-container-ns")
        res = self.in_mount_ns(["mount", *args, str(target)])
        if res.returncode != 0 or mount_points(self.pid).count(str(target)) != before + 1:
            raise PluginContainerError(f"mount {args} on {target}: {res.stderr.strip()}")

    def umount(self, target: Path, *, lazy: bool = False) -> None:
        """Undo the topmost mount on target in the plugin's namespace; verified."""
        before = mount_points(self.pid).count(str(target))
        res = self.in_mount_ns(["umount", *(["-l"] if lazy else []), str(target)])
        if res.returncode != 0 or mount_points(self.pid).count(str(target)) != before - 1:
            raise PluginContainerError(f"umount {target}: {res.stderr.strip()}")
