"""The Docker engine the harness builds images with and runs the plugin container under.

By default a private engine: dockerd and its containerd with their own data root, exec root and
sockets (never /var/run/docker.sock, never /run/containerd), no bridge, no iptables, so nothing
the harness does touches another engine on the machine or its networks. It is started on demand
and shared by every user on this machine (xdist workers, `nox -s image`): each user holds a file
under users/ and the last one to leave stops the engine, if the harness started it. Images live
on in the data root, so a stopped engine keeps the build cache. An external engine (a run's
`--docker-host`, from its run context) is used instead when given, never started nor stopped.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker

from hvconform.contract.ledger import Ledger
from hvconform.targets.host.hostfiles import mounts_below, umount
from hvconform.targets.host.procs import alive

DATA_ROOT = Path(os.environ.get("HV_DOCKER_DATA_ROOT", "/var/lib/hv-docker"))
EXEC_ROOT = Path(os.environ.get("HV_DOCKER_EXEC_ROOT", "/run/hv-docker"))
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0

_CONTAINERD_CONF = """\
version = 2
root = "{root}"
state = "{state}"
# Only what dockerd needs: no CRI plugin (it would look for CNI and listen for streams).
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
"""


class EngineError(RuntimeError):
    """The engine could not be started, reached or stopped."""


def ping(host: str, timeout: int = 2) -> bool:
    """The engine at `host` answers its API."""
    try:
        client = docker.DockerClient(base_url=host, timeout=timeout)
    except docker.errors.DockerException:
        return False
    try:
        return bool(client.ping())
    except (docker.errors.DockerException, OSError):
        return False
    finally:
        client.close()


class DockerEngine:
    """One user of the engine: `acquire()` before use, `release()` after (or `with`)."""

    def __init__(
        self,
        ledger: Ledger | None = None,
        *,
        what: str = "hvconform",
        data_root: Path = DATA_ROOT,
        exec_root: Path = EXEC_ROOT,
        bridge: bool = False,
        external: str = "",
        dockerd_args: tuple[str, ...] = (),
    ) -> None:
        self.ledger = ledger
        self.what = what
        # bridge: user-defined bridge networks with published ports (kind's "kind" network and
        # its API server port), still no iptables, NAT or default bridge. Opt-in, for an engine
        # of its own roots (the kind engine): the default engine keeps every container offline.
        self.data_root, self.exec_root, self.bridge = data_root, exec_root, bridge
        self.dockerd_args = dockerd_args  # e.g. a default runtime of its own
        self.external = external
        self.host = self.external or f"unix://{exec_root}/docker.sock"
        self.started_here = False  # this user started the engine (evidence, not ownership)
        self._user: Path | None = None

    # -- users and the lock ----------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.exec_root.mkdir(mode=0o700, parents=True, exist_ok=True)
        with (self.exec_root / "engine.lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _live_users(self) -> list[Path]:
        users = self.exec_root / "users"
        live = []
        for entry in sorted(users.iterdir()) if users.is_dir() else []:
            pid = int(entry.name.split("-", 1)[0])
            if alive(pid):
                live.append(entry)
            else:
                entry.unlink(missing_ok=True)  # a user that died without releasing
        return live

    def acquire(self) -> str:
        """Make sure the engine runs; returns its host (a `unix://` URL)."""
        if self.external:
            if not ping(self.external):
                raise EngineError(f"the engine at {self.external} (--docker-host) does not answer")
            return self.host
        with self._locked():
            if not ping(self.host):
                if (self.exec_root / "started-by-hvconform").exists():
                    self._stop()  # ours, but hung or half-dead: start afresh
                self._start()
                self.started_here = True
            users = self.exec_root / "users"
            users.mkdir(exist_ok=True)
            self._user = users / f"{os.getpid()}-{secrets.token_hex(4)}"
            self._user.write_text(self.what + "\n")
        return self.host

    def release(self) -> None:
        """Leave; the last user stops an engine the harness started."""
        if self.external or self._user is None:
            return
        with self._locked():
            self._user.unlink(missing_ok=True)
            self._user = None
            if not self._live_users() and (self.exec_root / "started-by-hvconform").exists():
                self._stop()

    def client(self, timeout: int = 120) -> docker.DockerClient:
        """A client of the engine; the caller closes it."""
        return docker.DockerClient(base_url=self.host, timeout=timeout)

    def __enter__(self) -> DockerEngine:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- the processes ---------------------------------------------------------------------

    def _spawn(self, argv: list[str], log: Path, what: str) -> int:
        with log.open("ab") as fh:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh, start_new_session=True
            )
        if self.ledger is not None:
            self.ledger.record_process(proc.pid, what)
        return proc.pid

    def _start(self) -> None:
        for tool in ("dockerd", "containerd"):
            if not any(Path(d, tool).exists() for d in os.get_exec_path()):
                raise EngineError(f"{tool} not found: apt-get install docker.io")
        self.data_root.mkdir(mode=0o711, parents=True, exist_ok=True)
        ctr_state = self.exec_root / "containerd"
        ctr_state.mkdir(mode=0o711, exist_ok=True)
        sock = ctr_state / "containerd.sock"
        conf = self.exec_root / "containerd.toml"
        conf.write_text(
            _CONTAINERD_CONF.format(root=self.data_root / "containerd", state=ctr_state, sock=sock)
        )
        ctr_pid = self._spawn(
            ["containerd", "--config", str(conf)], self.exec_root / "containerd.log", "containerd"
        )
        self._wait(lambda: sock.exists(), "containerd socket", ctr_pid)
        dockerd = [
            "dockerd", "--data-root", str(self.data_root), "--exec-root", str(self.exec_root / "exec"),
            "--pidfile", str(self.exec_root / "dockerd.pid"), "-H", self.host,
            "--containerd", str(sock),
            # No default bridge, no NAT rules, no proxy: containers run with --network none.
            "--bridge", "none", "--iptables=false", "--ip6tables=false", "--ip-masq=false",
            f"--userland-proxy={'true' if self.bridge else 'false'}", "--storage-driver",
            "overlay2", *self.dockerd_args,
        ]  # fmt: skip
        d_pid = self._spawn(dockerd, self.exec_root / "dockerd.log", "dockerd")
        (self.exec_root / "started-by-hvconform").write_text(f"{d_pid} {ctr_pid}\n")
        self._wait(lambda: ping(self.host), f"dockerd at {self.host}", d_pid)

    def _wait(self, ready: Callable[[], bool], what: str, pid: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if not alive(pid):
                raise EngineError(f"{what}: process {pid} exited; see {self.exec_root}/*.log")
            if time.monotonic() > deadline:
                raise EngineError(f"{what} not up after {START_TIMEOUT_S:g}s")
            time.sleep(0.1)

    def _stop(self) -> None:
        marker = self.exec_root / "started-by-hvconform"
        pids = [int(p) for p in marker.read_text().split()]
        # dockerd first: it stops its containers and shims, then containerd can go.
        for pid in pids:
            if not alive(pid):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                time.sleep(0.2)
            _reap(pid)
        marker.unlink()
        left = [pid for pid in pids if alive(pid)]
        if left:
            raise EngineError(f"engine processes {left} survived SIGKILL")
        # dockerd keeps its default network namespace bind-mounted below its exec root after a
        # clean shutdown (exec/netns/default): ours, and nothing else uses it once it is gone.
        for point in reversed(mounts_below(self.exec_root)):
            umount(Path(point))


def _reap(pid: int) -> None:
    # Our own children stay zombies until waited for; others' are reaped by their parent.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
