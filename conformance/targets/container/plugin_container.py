"""The plugin as a hardened container under the Docker engine, driven through testcontainers.

It runs what the profile's objects describe (targets.container.spec: image, command and args,
env, user, read-only root, tmpfs mounts) with what a DaemonSet pod of the plugin gets from the
node: hostPath-like bind mounts of the node's plugin, CDI and host-device dirs at the profile's
paths with rslave propagation (HostToContainer), and the profile's hypervisor devices passed
explicitly (`--device /dev/kvm:/dev/kvm:rw`: rw, never m). The harness's hardening is fixed, as
in the process runtime: every capability dropped, no-new-privileges, no network.

Probes: with no network the harness reaches the plugin's HTTP port through the container's
network namespace: a short-lived thread setns()es into /proc/<pid>/ns/net and connects to
127.0.0.1 there; the socket stays in that namespace, the request is made from the harness. Exec
probes run through the engine (`docker exec`), as a kubelet's do. Faults inside the plugin's
mount namespace are made by targets.container.nsops (system calls, no tool needed in the image).
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
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testcontainers.core.config import testcontainers_config
from testcontainers.core.container import DockerContainer

from hvconform.contract.ledger import Ledger
from hvconform.targets.container import nsops
from hvconform.targets.container.engine import DATA_ROOT
from hvconform.targets.container.spec import ContainerSpec
from hvconform.targets.host.procs import mount_points, proc_status

# TESTCONTAINERS_RYUK_DISABLED=true, forced rather than defaulted: the reaper is an image that
# would be pulled from a registry, and none exists here.
testcontainers_config.ryuk_disabled = True

CLONE_NEWNET = 0x40000000
CAP_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
STOP_GRACE_S = 15
EXEC_TIMEOUT_S = 10.0


class PluginContainerError(RuntimeError):
    """The plugin container could not be started, reached or removed."""


@dataclass(frozen=True)
class Bind:
    """A node directory (or file) bound into the container, as a hostPath volume."""

    source: Path
    target: str
    read_only: bool = False


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
        spec: ContainerSpec,
        binds: Sequence[Bind],
        devices: Sequence[str],
        ledger: Ledger,
        name: str,
        log_path: Path,
        records: list[dict[str, Any]] | None = None,
    ) -> None:
        self.host = host
        self.spec = spec
        self.image = spec.image
        self.binds = list(binds)
        self.devices = list(devices)
        self.ledger = ledger
        self.base_name = name
        self.log_path = log_path
        self.generation = 0
        # One per container started: id, image, inspection (shared with the node's report).
        self.records: list[dict[str, Any]] = [] if records is None else records
        self._tc: DockerContainer | None = None
        self._pid = 0

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return f"{self.base_name}-{self.generation}"

    def _configure(self) -> DockerContainer:
        spec = self.spec
        tc = DockerContainer(
            self.image, docker_client_kw={"environment": {"DOCKER_HOST": self.host}}
        )
        tc.with_name(self.name)
        if spec.args is not None:
            tc.with_command(list(spec.args))
        for key, value in spec.env.items():
            tc.with_env(key, value)
        for bind in self.binds:
            tc.with_volume_mapping(
                str(bind.source), bind.target, "ro,rslave" if bind.read_only else "rw,rslave"
            )
        for target, options in spec.tmpfs.items():
            tc.with_tmpfs_mount(target, options)  # passed through as the tmpfs options
        extra: dict[str, Any] = {}
        if spec.entrypoint is not None:
            extra["entrypoint"] = list(spec.entrypoint)
        if spec.user:
            extra["user"] = spec.user
        if spec.working_dir:
            extra["working_dir"] = spec.working_dir
        tc.with_kwargs(
            cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=spec.read_only,
            network_mode="none", devices=[f"{d}:{d}:rw" for d in self.devices],
            stop_signal="SIGTERM", labels={"dev.hyperlight.hv.role": "plugin-under-test"},
            **extra,
        )  # fmt: skip
        return tc

    def start(self) -> int:
        """Create and start a container; returns the plugin's host pid."""
        if self._tc is not None:
            raise PluginContainerError(f"{self.name} is already running")
        self.generation += 1
        tc = self._configure()
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
            if self.records:
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

    def attrs(self) -> dict[str, Any]:
        """The engine's inspection of the running container, fresh."""
        if self._tc is None:
            raise PluginContainerError("no plugin container running")
        wrapped = self._tc.get_wrapped_container()
        wrapped.reload()
        data: dict[str, Any] = wrapped.attrs
        return data

    def http_get(
        self, port: int, path: str, timeout: float = 2.0, host: str = "127.0.0.1"
    ) -> tuple[int, bytes]:
        """GET http://<host>:<port><path> inside the container's network namespace."""
        sock = netns_connect(self.pid, host, port, timeout)
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        conn.sock = sock
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def exec(self, argv: Sequence[str], timeout: float = EXEC_TIMEOUT_S) -> tuple[int, str]:
        """Run argv in the container through the engine, as a kubelet's exec probe runs (the
        container's env, user and confinement); exit code and output. One that outlasts
        `timeout` is abandoned (PluginContainerError), as a probe's timeoutSeconds does."""
        tc = self._tc
        if tc is None:
            raise PluginContainerError("no plugin container running")
        done: dict[str, Any] = {}

        def run() -> None:
            try:
                done["result"] = tc.exec(list(argv))
            except Exception as exc:  # the engine's own errors: no answer
                done["error"] = exc

        thread = threading.Thread(target=run, name=f"exec-{self.name}", daemon=True)
        thread.start()
        thread.join(timeout)
        if "result" not in done:
            why = done.get("error") or f"no answer within {timeout:g}s"
            raise PluginContainerError(f"exec {' '.join(argv)[:80]} in {self.name}: {why}")
        result = done["result"]
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
            "path": attrs.get("Path"),
            "args": attrs.get("Args"),
            **self.capabilities(),
            "cap_drop": hc.get("CapDrop"),
            "security_opt": hc.get("SecurityOpt"),
            "read_only_rootfs": hc.get("ReadonlyRootfs"),
            "network_mode": hc.get("NetworkMode"),
            "devices": [f"{d['PathOnHost']}:{d['PathInContainer']}:{d['CgroupPermissions']}"
                        for d in hc.get("Devices") or []],
            "binds": hc.get("Binds"),
            "privileged": hc.get("Privileged"),
            "user": attrs["Config"].get("User"),
        }  # fmt: skip

    def log_tail(self, lines: int = 50) -> str:
        """End of the plugin's output: earlier containers' logs, then the running one's."""
        text = self.log_path.read_bytes() if self.log_path.exists() else b""
        if self._tc is not None:
            with contextlib.suppress(Exception):  # a gone container has no more logs to add
                text += self._tc.get_wrapped_container().logs(tail=lines)
        return "\n".join(text.decode(errors="replace").splitlines()[-lines:])

    # -- faults inside the plugin's mount namespace ---------------------------------------

    def ns_op(self, *args: str) -> None:
        """One nsops operation in the plugin's mount namespace (see nsops)."""
        cmd = [sys.executable, "-I", nsops.__file__, str(self.pid), *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        if res.returncode != 0:
            raise PluginContainerError(
                res.stderr.strip() or f"nsops {args} exited {res.returncode}"
            )

    def plugin_mounts(self) -> list[str]:
        """Mount points as the plugin sees them."""
        return mount_points(self.pid)

    def bind_mount(self, source: Path, target: str) -> None:
        """Bind a host path over `target` in the plugin's namespace only; verified there."""
        before = self.plugin_mounts().count(target)
        self.ns_op("bind", str(source), target)
        if self.plugin_mounts().count(target) != before + 1:
            raise PluginContainerError(f"bind {source} on {target}: not in the plugin's mounts")

    def umount(self, target: str, *, lazy: bool = False) -> None:
        """Undo the topmost mount on target in the plugin's namespace; verified."""
        before = self.plugin_mounts().count(target)
        self.ns_op("umount", target, *(["lazy"] if lazy else []))
        if self.plugin_mounts().count(target) != before - 1:
            raise PluginContainerError(f"umount {target}: still in the plugin's mounts")
