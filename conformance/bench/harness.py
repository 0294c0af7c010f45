"""The bench node: a plugin started from its profile, registered with the real kubelet emulator.

Any plugin runs the way the suite's local target runs it (hvconform.targets.local): its
profile's command as is, in a sandbox (own mount and network namespaces, no capabilities), with
the node's directories bound at the paths its profile names. A per-run short /tmp root holds the
kubelet plugin dir, a tmpfs with the CDI dir and a staging dir (an injected file arrives by one
rename; a node's /run/cdi is tmpfs too), and a tmpfs host-device view for a plugin that reads
one. The plugin's own /dev/kvm is made with mknod (the real device's numbers), not bound, so a
device fault is one unlink or rename, as fast for one plugin as for another. Everything created
is written down in a ledger and proven gone by close().
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api import deviceplugin_pb2_grpc as pb_grpc
from hvconform.bench import procfs
from hvconform.bench.waits import BenchTimeout, poll_until, wait_until, within
from hvconform.contract.ledger import Ledger, process_ident, read_entries, survivors
from hvconform.contract.plugin import PluginUnderTest, resolve
from hvconform.kubelet import LoopThread, ThreadedKubeletEmulator
from hvconform.targets.host.netns import NetNamespace, free_index
from hvconform.targets.host.sandbox import PluginSandbox
from hvconform.targets.local.observe import Observer

SETUP_S = 60.0
STOP_S = 15.0
HEALTH_PORT = 8080
# Network namespace indexes of bench sandboxes: clear of the local target (1..63) and of the
# sandbox tests' per-worker blocks near the bottom of 64..255.
NET_INDEXES = range(240, 256)


class BenchSandbox(PluginSandbox):
    """The suite's sandbox, except that the hypervisor nodes are made, not bound (see above):
    give `made_nodes` and no `dev_nodes`."""

    made_nodes: tuple[str, ...] = ()

    def _bind_args(self) -> list[str]:
        nodes = []
        for path in self.made_nodes:
            real = os.stat(path)
            mode = f"{stat.S_IMODE(real.st_mode):o}"
            major, minor = os.major(real.st_rdev), os.minor(real.st_rdev)
            nodes += ["--mknod", f"{path}:c:{major}:{minor}:{mode}:0:0"]
        return [*super()._bind_args(), *nodes]


def stale_variant(desired: bytes) -> bytes:
    """A valid spec that differs from the desired one (another writer's older version)."""
    if b"65534" in desired:
        return desired.replace(b"65534", b"65533")
    data = json.loads(desired)
    data.setdefault("annotations", {})["hvconform.bench/stale"] = "1"
    return json.dumps(data, indent=2).encode() + b"\n"


class Bench:
    """Node, emulator and plugin of one bench run; use as a context manager."""

    def __init__(
        self, log_path: Path, plugin: PluginUnderTest | None = None, loop: LoopThread | None = None
    ) -> None:
        self.plugin = plugin or resolve()
        self.name = self.plugin.name
        self.log_path = log_path
        self.root = Path(tempfile.mkdtemp(prefix="hvb-", dir="/tmp"))
        self.ledger = Ledger(self.root / "ledger.jsonl", "bench")
        self.ledger.record("dir", str(self.root), "bench")
        self.plugin_dir = self.root / "dp"
        self.tmpfs = self.root / "run"
        self.cdi_dir = self.tmpfs / "cdi"
        self.stage_dir = self.tmpfs / "stage"
        self.host_dev = self.root / "dev"
        self.kvm_rdev = os.stat("/dev/kvm").st_rdev
        # the loop the bench's own grpc.aio clients run on (one per process: see loopthread)
        self.kubelet = ThreadedKubeletEmulator(self.plugin_dir, loop=loop)
        self.sandbox: BenchSandbox | None = None
        self.resource = self.plugin.resource or ""
        self.slots = 0
        self.device_ids: list[str] = []
        self.cdi_names: list[str] = []
        self.spec_name = ""
        self.desired = b""
        self.stale = b""
        self.corrupt = b""
        self.exit_code: int | None = None
        self.stop_s: float | None = None  # SIGTERM -> exit
        self.readiness = Observer(
            self.plugin,
            self.plugin.readiness,
            health_addr=lambda: self._sandbox().health_addr,
            socket=self.socket_or_none,
            pid=lambda: self.pid,
        )

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> Bench:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _mount_tmpfs(self, where: Path, size: str) -> None:
        where.mkdir()
        opts = f"size={size},mode=0755"
        _run("mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where))
        self.ledger.record("mount", str(where), "bench")

    def prepare(self) -> None:
        """Directories, mounts, the sandbox and its network namespace; nothing runs yet.

        Creating a network namespace forks (pyroute2), and a fork while grpc's threads run
        (the kubelet emulator) can crash the child: every bench of a run is prepared first."""
        if self.sandbox is not None:
            return
        self._mount_tmpfs(self.tmpfs, "4m")
        self._mount_tmpfs(self.host_dev, "64k")
        for d in (self.plugin_dir, self.cdi_dir, self.stage_dir, self.root / "state"):
            d.mkdir()
        os.mknod(self.host_dev / "kvm", 0o600 | stat.S_IFCHR, self.kvm_rdev)
        paths = self.plugin.paths
        binds = [
            (str(self.plugin_dir), paths.device_plugin_dir),
            (str(self.cdi_dir), paths.cdi_dir),
        ]
        if paths.host_dev_dir:
            binds.append((str(self.host_dev), paths.host_dev_dir))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        sandbox = BenchSandbox(
            [],
            run_dir=self.root / "state",
            ledger=self.ledger,
            index=free_index(NET_INDEXES),
            dev_nodes=(),
            log_path=self.log_path,
            http_port=HEALTH_PORT,
            binds=binds,
        )
        self.sandbox = sandbox
        sandbox.made_nodes = paths.devices
        sandbox.argv = self.plugin.argv(sandbox.health_addr)
        sandbox.env.update(self.plugin.environment(sandbox.health_addr))
        sandbox.netns = NetNamespace(sandbox.netns_name, sandbox.index, self.ledger)

    def _start(self) -> None:
        self.prepare()
        self.kubelet.start()
        self._sandbox().start()
        self.resource = self.resource or wait_until(
            self._registered_resource, SETUP_S, f"{self.name}'s first Register"
        )
        self.slots = wait_until(self.all_allocatable, SETUP_S, "every slot allocatable")
        self.device_ids = sorted(self.kubelet.state(self.resource).healthy)
        wait_until(self.ready, SETUP_S, f"{self.name} ready ({self.plugin.readiness.type})")
        self.cdi_names = self._first_allocation()
        self.spec_name = self.plugin.cdi_spec or self._discover_spec()
        if self.spec_name:
            self.desired = wait_until(self.spec_bytes, SETUP_S, "the plugin's CDI spec")
            self.stale = stale_variant(self.desired)
            self.corrupt = self.desired[: len(self.desired) // 2]
        self.tree()

    def _registered_resource(self) -> str | None:
        self._alive("at start-up")
        names = self.kubelet.registered_resources()
        return names[0] if names else None

    def _alive(self, when: str) -> None:
        if self.sandbox is not None and not self.sandbox.running:
            raise RuntimeError(f"{self.name} exited {when}: {self.sandbox.log_tail(2000)}")

    def _first_allocation(self) -> list[str]:
        """CDI device names of one Allocate (the suite discovers them the same way)."""
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=self.device_ids[:1])]
        )
        with grpc.insecure_channel(f"unix:{self.socket()}") as channel:
            answer = pb_grpc.DevicePluginStub(channel).Allocate(request, timeout=SETUP_S)
        return [d.name for c in answer.container_responses for d in c.cdi_devices]

    def _discover_spec(self) -> str:
        """The one file in the CDI dir declaring the allocated device's kind ("" if none)."""
        if not self.cdi_names:
            return ""
        kind = self.cdi_names[0].partition("=")[0]

        def one() -> str | None:
            for path in sorted(self.cdi_dir.iterdir()):
                try:
                    if json.loads(path.read_bytes()).get("kind") == kind:
                        return path.name
                except (OSError, ValueError, AttributeError):
                    continue
            return None

        return wait_until(one, SETUP_S, f"a CDI spec of kind {kind}")

    def all_allocatable(self) -> int | None:
        """The slot count once the emulator counts every slot allocatable, else None."""
        cap = self.kubelet.capacity(self.resource)
        return cap if cap > 0 and self.kubelet.allocatable(self.resource) == cap else None

    def ready(self) -> bool:
        """The profile's readiness probe; without one, the kubelet's view (all allocatable)."""
        self._alive("while waiting for readiness")
        if not self.readiness.observable:
            return self.all_allocatable() is not None
        return self.readiness()

    def restart(self) -> float:
        """Stop the plugin (SIGTERM), start it again from its profile; returns the exec time."""
        sandbox = self._sandbox()
        sandbox.stop()
        sandbox.start()
        assert sandbox.exec_at is not None
        self.tree()
        return sandbox.exec_at

    def close(self) -> list[str]:
        """Stop everything, remove everything; returns what survived (should be empty)."""
        if self.sandbox is not None and self.sandbox.running:
            self.tree()  # write down the probe helper too, so its end is verified
            asked = time.monotonic()
            try:
                self.exit_code = self.sandbox.stop(signal.SIGTERM, STOP_S)
            finally:
                self.stop_s = time.monotonic() - asked
        problems: list[str] = []
        if self.sandbox is not None:
            try:
                self.sandbox.close()
            except RuntimeError as exc:
                problems.append(str(exc))
        try:
            self.kubelet.stop()
        except Exception as exc:  # the emulator may never have started
            problems.append(f"kubelet emulator stop: {exc}")
        entries = read_entries([self.ledger.path])
        for entry in reversed(entries):
            if entry.kind == "mount" and Path(entry.ident).is_mount():
                try:
                    _run("umount", entry.ident)
                except subprocess.SubprocessError as exc:
                    problems.append(f"umount {entry.ident}: {exc}")
        shutil.rmtree(self.root, ignore_errors=True)
        left = [f"{e.kind} {e.ident} ({e.detail})" for e in survivors(entries)]
        return left + [p for p in problems if left]

    # -- the plugin ----------------------------------------------------------------------

    def _sandbox(self) -> BenchSandbox:
        if self.sandbox is None:
            raise RuntimeError("bench plugin not started")
        return self.sandbox

    @property
    def pid(self) -> int:
        return self._sandbox().pid

    @property
    def python(self) -> bool:
        """A Python plugin: its own threads are named python, grpc's C threads otherwise."""
        return procfs.cmdline(self.pid).split(" ")[0].rsplit("/", 1)[-1].startswith("python")

    def tree(self) -> list[int]:
        """The plugin and its descendants now; each is written down for the cleanup check."""
        pids = procfs.process_tree(self.pid)
        known = {e.ident for e in read_entries([self.ledger.path])}
        for pid in pids:
            ident = process_ident(pid)
            if ident not in known:
                self.ledger.record("process", ident, procfs.cmdline(pid)[:80])
        return pids

    def track(self, pid: int, what: str) -> None:
        """Write down a helper process (reader, load generator) for the cleanup check."""
        self.ledger.record_process(pid, what)

    def socket_or_none(self) -> Path | None:
        ok = [r for r in self.kubelet.registrations(self.resource) if r.ok]
        return Path(ok[-1].socket_path) if ok else None

    def socket(self) -> Path:
        """The plugin socket of its latest successful registration."""
        path = self.socket_or_none()
        if path is None:
            raise BenchTimeout(f"a registration of {self.name}", 0.0)
        return path

    # -- faults --------------------------------------------------------------------------

    @property
    def spec_path(self) -> Path:
        return self.cdi_dir / self.spec_name

    def spec_bytes(self) -> bytes | None:
        try:
            return self.spec_path.read_bytes()
        except OSError:
            return None

    def delete_spec(self) -> None:
        self.spec_path.unlink()

    def corrupt_spec(self) -> None:
        """Overwrite in place (truncate, then a torn half): a partial write, not a rename."""
        fd = os.open(self.spec_path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, self.corrupt)
        finally:
            os.close(fd)

    def replace_spec(self, data: bytes) -> None:
        """Atomic replacement from the staging dir: the CDI dir sees exactly one MOVED_TO."""
        tmp = self.stage_dir / f"inject-{secrets.token_hex(4)}"
        tmp.write_bytes(data)
        tmp.chmod(0o644)
        tmp.rename(self.spec_path)

    def _own_dev(self) -> Path:
        """The plugin's /dev/kvm, reached through its root (its mount namespace)."""
        return Path(f"/proc/{self.pid}/root/dev/kvm")

    def _looked_at(self) -> Path:
        """Where the plugin looks for the device: its host-device view if it reads one."""
        return self.host_dev / "kvm" if self.plugin.paths.host_dev_dir else self._own_dev()

    def remove_device(self) -> None:
        self._looked_at().unlink()

    def restore_device(self) -> None:
        _place(self._looked_at(), self.kvm_rdev)

    def device_present(self) -> bool:
        return self._looked_at().exists()

    def device_usable(self) -> bool:
        """The plugin's /dev/kvm has the real device's numbers (no unusable node left)."""
        return self._own_dev().stat().st_rdev == self.kvm_rdev

    def make_unusable(self, unusable: bool) -> None:
        """/dev/null's node at the hypervisor path (and in the host view, identity made to
        match), each by one rename; or the real device's node back."""
        rdev = os.makedev(1, 3) if unusable else self.kvm_rdev
        if self.plugin.paths.host_dev_dir:
            _place(self.host_dev / "kvm", rdev)
        _place(self._own_dev(), rdev)


def _place(path: Path, rdev: int) -> None:
    """A character node with `rdev` at `path`, atomically (mknod beside it, then rename)."""
    tmp = path.with_name(f".{path.name}-{secrets.token_hex(4)}")
    os.mknod(tmp, 0o600 | stat.S_IFCHR, rdev)
    tmp.rename(path)


def _run(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, text=True, timeout=30)


@contextlib.asynccontextmanager
async def floor_server(bench: Bench) -> AsyncIterator[tuple[Path, int]]:
    """The do-nothing plugin (hvconform.bench.floor) on a socket in the node: (path, pid)."""
    path = bench.root / "floor.sock"
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "hvconform.bench.floor", str(path), "--slots", str(bench.slots))
    )
    bench.track(proc.pid, "floor server")
    try:
        await poll_until(path.exists, SETUP_S, "the floor server's socket", interval=0.01)
        yield path, proc.pid
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await within(proc.wait(), STOP_S, "the floor server to exit after SIGTERM")
