"""A plugin in a pod-like sandbox on the local node, with no cluster.

The plugin runs through the launcher: its own network namespace (veth to the root namespace, so
the harness probes it at 10.231.<i>.2 from outside), a private mount namespace whose /dev holds
only the base nodes and the injected device nodes, uid 0 with every capability set empty and
no_new_privs: what `capabilities: drop: [ALL]`, `allowPrivilegeEscalation: false` and a device
allocation give a DaemonSet pod. Membership is the plugin's mount namespace: every process in it
belongs to the sandbox and is killed when the plugin stops, as a runtime kills a container's
cgroup. The network namespace outlives restart(), as a pod's does across container restarts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from hvconform.contract.ledger import Ledger
from hvconform.targets.host import binds as binds_mod
from hvconform.targets.host import launcher
from hvconform.targets.host.netns import NetNamespace
from hvconform.targets.host.procs import (
    mount_points,
    namespace_members,
    proc_status,
    read_handshake,
)

LAUNCHER = launcher.LAUNCHER
# Where the root is staged when a bind needs a new top-level directory: an existing directory
# that the namespace may cover (covering it there hides nothing the plugin needs).
_STAGES = ("/mnt", "/media", "/srv")
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class SandboxError(RuntimeError):
    """The sandbox could not start, or something it made survived close()."""


class PluginSandbox:
    """Run `argv` as a sandboxed plugin; see the module docstring for what that means."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        run_dir: Path,
        ledger: Ledger,
        index: int,
        dev_nodes: Sequence[str] = ("/dev/kvm",),
        env: Mapping[str, str] | None = None,
        log_path: Path,
        http_port: int = 8080,
        python: str = sys.executable,
        binds: Sequence[tuple[str, str]] = (),
    ) -> None:
        if not run_dir.is_dir():
            raise SandboxError(f"run_dir {run_dir} is not a directory")
        self.argv = list(argv)
        self.run_dir = run_dir
        self.ledger = ledger
        self.index = index
        self.dev_nodes = tuple(dev_nodes)
        self.env = dict(os.environ if env is None else env)
        self.log_path = log_path
        self.http_port = http_port
        self.python = python
        # Host dirs bound at the paths the plugin expects (hostPath volumes); a new top-level
        # directory needs the root staged (binds.py), and the harness then adds the prefix.
        self.binds = [(str(src), dst) for src, dst in binds]
        stages = [d for d in _STAGES if Path(d).is_dir() and not Path(d).is_symlink()]
        needs = binds_mod.needs_new_root([dst for _, dst in self.binds])
        if needs and not stages:
            raise SandboxError(f"no staging directory among {', '.join(_STAGES)} for new paths")
        self.stage_root: str | None = stages[0] if needs else None
        self.netns_name = f"hvsbx{index}-{os.getpid()}"
        self.ns_addr = f"10.231.{index}.2"
        self.host_addr = f"10.231.{index}.1"
        self.netns: NetNamespace | None = None
        self.mnt_ns: str | None = None
        self._ns_fd: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.exec_at: float | None = None  # monotonic time the launcher exec'ed the plugin
        # Host nodes bound over device paths at the next start only (a device not yet usable).
        self.dev_covers: list[tuple[str, str]] = []
        self._closed = False

    @property
    def health_addr(self) -> str:
        """`ADDR:PORT` to give the plugin (e.g. `--health-addr`)."""
        return f"{self.ns_addr}:{self.http_port}"

    @property
    def pid(self) -> int:
        """Pid of the plugin (the launcher exec'ed it: same process)."""
        if self._proc is None:
            raise SandboxError("sandbox not started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def launcher_argv(self, exec_fd: int | None = None) -> list[str]:
        """The full command line, launcher included."""
        nodes = [arg for node in self.dev_nodes for arg in ("--dev-node", node)]
        nodes += [arg for src, dst in self.dev_covers for arg in ("--dev-cover", f"{src}:{dst}")]
        handshake = [] if exec_fd is None else [f"--exec-fd={exec_fd}"]
        return [
            self.python, "-I", str(LAUNCHER), "--netns", self.netns_name, "--private-dev",
            *nodes, *self._bind_args(), "--drop-caps", "--no-new-privs", *handshake, "--",
            *self.argv,
        ]  # fmt: skip

    def _bind_args(self) -> list[str]:
        args = [arg for src, dst in self.binds for arg in ("--bind", f"{src}:{dst}")]
        return args + (["--stage-root", self.stage_root] if self.stage_root else [])

    def ns_path(self, path: str | os.PathLike[str]) -> str:
        """Where a path of the plugin's own view is, for a process entering its mount ns."""
        return binds_mod.ns_path(self.stage_root or "/", os.fspath(path))

    def make_netns(self) -> None:
        """The sandbox's network namespace, made once (before the first start, when something
        must be ready in it before the plugin runs)."""
        if self.netns is None:
            self.netns = NetNamespace(self.netns_name, self.index, self.ledger)

    def start(self) -> int:
        """Create the network namespace (once) and launch the plugin; returns its pid."""
        if self._closed:
            raise SandboxError("sandbox closed")
        if self.running:
            raise SandboxError(f"plugin already running (pid {self.pid})")
        self.make_netns()
        read_fd, write_fd = os.pipe()
        try:
            with self.log_path.open("ab") as log:
                self._proc = subprocess.Popen(
                    self.launcher_argv(write_fd), stdin=subprocess.DEVNULL, stdout=log,
                    stderr=log, env=self.env, cwd=self.run_dir, pass_fds=(write_fd,),
                    start_new_session=True,
                )  # fmt: skip
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        self.ledger.record_process(self._proc.pid, f"plugin in {self.netns_name}")
        error = read_handshake(read_fd, 30.0, f"launcher of {self.argv[0]}")
        self.exec_at = time.monotonic()  # the handshake ends at the exec (close-on-exec)
        if error:
            code = self._proc.wait(10)
            raise SandboxError(f"launcher failed (exit {code}): {error}")
        self._pin_namespace(self._proc.pid)
        return self._proc.pid

    def _pin_namespace(self, pid: int) -> None:
        # Namespace inode numbers are recycled as soon as a namespace is freed. Holding ours open
        # keeps its number ours, so a membership scan never matches, and kills, a process of
        # another sandbox. Released once every member is verified gone; its mounts go with it.
        try:
            self._ns_fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._ns_fd, self.mnt_ns = None, None  # the plugin is already gone
            return
        self.mnt_ns = f"mnt:[{os.fstat(self._ns_fd).st_ino}]"

    def members(self) -> list[int]:
        """Live processes in the plugin's mount namespace (helpers and orphans included)."""
        if self._ns_fd is None or self.mnt_ns is None:
            return []
        return namespace_members(self.mnt_ns)

    def http_get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """GET across the veth from the root namespace, never through a proxy."""
        url = f"http://{self.ns_addr}:{self.http_port}{path}"
        try:
            with _NO_PROXY.open(url, timeout=timeout) as resp:
                return int(resp.status), bytes(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def wait_http(
        self, path: str = "/healthz", timeout_s: float = 20.0, status: int = 200
    ) -> bytes:
        """Poll until GET `path` answers `status`; fails early if the plugin exits."""
        what = f"GET http://{self.health_addr}{path} to answer {status}"
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            if not self.running:
                raise SandboxError(f"plugin exited while waiting for {what}:\n{self.log_tail()}")
            try:
                code, body = self.http_get(path, timeout=min(2.0, timeout_s))
            except OSError as exc:
                last = str(exc)
            else:
                if code == status:
                    return body
                last = f"status {code}"
            time.sleep(0.05)
        raise TimeoutError(f"timed out after {timeout_s}s waiting for {what} (last: {last})")

    def in_plugin_ns(
        self, argv: Sequence[str], timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a command (with the harness's privileges) in the plugin's mount namespace."""
        cmd = ["nsenter", "-t", str(self.pid), "-m", "--", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)

    def plugin_mounts(self) -> list[str]:
        """Mount points as the plugin sees them."""
        return mount_points(self.pid)

    def bind_mount(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        """Bind `src` over `dst` in the plugin's mount namespace only; verified there."""
        # mountinfo names mount points as the plugin sees them (below its root); the mount
        # command, run from the namespace's own root, needs the staged prefix.
        src, view, dst = os.fspath(src), os.fspath(dst), self.ns_path(dst)
        before = self.plugin_mounts().count(view)
        self.ledger.record("mount", dst, "plugin-ns")
        res = self.in_plugin_ns(["mount", "--bind", src, dst])
        if res.returncode != 0:
            raise SandboxError(f"bind {src} on {dst} in plugin ns: {res.stderr.strip()}")
        if self.plugin_mounts().count(view) != before + 1:
            raise SandboxError(f"bind {src} on {view}: not in /proc/{self.pid}/mountinfo")

    def umount(self, dst: str | os.PathLike[str], *, lazy: bool = False) -> None:
        """Undo the topmost mount on `dst` in the plugin's mount namespace; verified there.

        `lazy` detaches a mount the plugin still holds (a socket bound in it), as a runtime
        tearing down a volume would.
        """
        view, dst = os.fspath(dst), self.ns_path(dst)
        before = self.plugin_mounts().count(view)
        res = self.in_plugin_ns(["umount", *(["-l"] if lazy else []), dst])
        if res.returncode != 0:
            raise SandboxError(f"umount {dst} in plugin ns: {res.stderr.strip()}")
        if self.plugin_mounts().count(view) != before - 1:
            raise SandboxError(f"umount {view}: still in /proc/{self.pid}/mountinfo")

    def effective_caps(self) -> dict[str, int]:
        """Capability sets and NoNewPrivs of the plugin, from /proc/<pid>/status."""
        status = proc_status(self.pid)
        caps = {key: int(status[key], 16) for key in launcher.CAP_FIELDS}
        return {**caps, "NoNewPrivs": int(status["NoNewPrivs"])}

    def _reap_members(self) -> None:
        """SIGKILL whatever is left in the sandbox (helpers, orphans), wait, then unpin."""
        deadline = time.monotonic() + 10.0
        while members := self.members():
            if time.monotonic() > deadline:
                raise SandboxError(f"processes {members} in {self.mnt_ns} survived SIGKILL for 10s")
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        if self._ns_fd is not None:
            os.close(self._ns_fd)
            self._ns_fd = None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Signal the plugin, SIGKILL after `timeout`; returns its exit code (-N: signal N)."""
        if self._proc is None:
            raise SandboxError("sandbox not started")
        if self._proc.poll() is None:
            self._proc.send_signal(sig)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._reap_members()
        return int(self._proc.returncode)

    def kill(self) -> int:
        """SIGKILL: a crash, no chance to clean up."""
        return self.stop(signal.SIGKILL, timeout=10.0)

    def restart(self) -> int:
        """Stop, then start the same argv in the same network namespace; returns the new pid."""
        self.stop()
        return self.start()

    def log_tail(self, chars: int = 4000) -> str:
        """End of the plugin's log (stdout and stderr)."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError as exc:
            return f"(log unreadable: {exc})"

    def leftovers(self) -> list[str]:
        """What of this sandbox still exists."""
        left = []
        if self._proc is not None and self._proc.poll() is None:
            left.append(f"plugin pid {self._proc.pid}")
        if members := self.members():
            left.append(f"processes {members} in {self.mnt_ns} (its mounts live on)")
        if self.netns is not None:
            left += self.netns.leftovers()
        return left

    def close(self) -> None:
        """Stop the plugin, remove the namespaces and links, verify nothing is left."""
        if self._closed:
            return
        errors: list[str] = []
        try:
            if self._proc is not None:
                self.stop()
        except (SandboxError, subprocess.TimeoutExpired) as exc:
            errors.append(str(exc))
        if self.netns is not None:
            try:
                self.netns.close()
            except RuntimeError as exc:
                errors.append(str(exc))
        left = self.leftovers()
        self._closed = not left
        if errors or left:
            raise SandboxError(f"sandbox {self.netns_name} teardown: {'; '.join(errors + left)}")

    def __enter__(self) -> PluginSandbox:
        if not self.running:
            try:
                self.start()
            except BaseException:
                self.close()
                raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
