"""The bench node: the real plugin as a subprocess, registered with the real kubelet emulator.

A per-run short /tmp root holds the kubelet plugin dir, a tmpfs with the CDI dir and a staging
dir (so an injected file arrives by one rename, as a node's /run/cdi is tmpfs too), and a tmpfs
host-dev view whose kvm node is mknod'ed from the real /dev/kvm's numbers. The plugin runs in a
private mount namespace as it would in a pod: other test runs' mounts on this shared machine never
wake its mount-table watcher. Everything created is written down and proven gone by close().
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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from conformance.bench import procfs
from conformance.contract.ledger import Entry, process_ident, survivors
from conformance.contract.wait import WaitExpired, wait_for
from conformance.kubelet import ThreadedKubeletEmulator
from plugin.api.names import HYPERVISOR_RESOURCE, SPEC_FILENAME
from plugin.cdi_spec import desired_spec

T = TypeVar("T")
RESOURCE = HYPERVISOR_RESOURCE
SPEC_NAME = SPEC_FILENAME
SETUP_S = 60.0
STOP_S = 15.0


@dataclass(frozen=True)
class Plan:
    """Sample counts and windows of one run; the full plan meets every minimum of issue #7."""

    warmup: int = 3  # discarded samples before each series (caches, the probe helper, grpc)
    cdi_injections: int = 30
    restarts: int = 20
    health_samples: int = 20
    stream_counts: tuple[int, ...] = (1, 10, 100)
    alloc_requests: tuple[tuple[int, int], ...] = ((1, 2000), (16, 8000))
    alloc_warmup: int = 100
    alloc_isolated: int = 200  # one at a time, spaced beyond --probe-max-age: each one probes
    alloc_isolated_gap_s: float = 0.05
    storm_min_reads: int = 100_000
    storm_min_cycles: int = 30
    storm_min_s: float = 5.0  # long enough for several whole-second read rates
    storm_max_s: float = 300.0
    idle_s: float = 60.0
    idle_window_s: float = 10.0
    suite: bool = True
    suite_timeout_s: float = 1800.0
    # Random pause between samples, so no sample stays in phase with a periodic timer.
    gap_s: tuple[float, float] = (0.05, 0.15)


FULL = Plan()
QUICK = Plan(
    warmup=2,
    cdi_injections=10,
    restarts=5,
    health_samples=5,
    alloc_requests=((1, 300), (16, 1000)),
    alloc_isolated=30,
    storm_min_reads=20_000,
    storm_min_cycles=10,
    storm_min_s=2.0,
    idle_s=10.0,
    idle_window_s=2.0,
    suite=False,
)


class BenchTimeout(WaitExpired):
    """A bench wait expired; the message names the wait."""

    def __init__(self, what: str, seconds: float, last: object = None) -> None:
        tail = f"; last observed: {last!r}" if last is not None else ""
        super().__init__(f"bench wait for {what} expired after {seconds:g} s{tail}")


async def within(aw: Awaitable[T], seconds: float, what: str) -> T:
    """Await with a deadline; BenchTimeout names `what` when it expires."""
    try:
        async with asyncio.timeout(seconds):
            return await aw
    except TimeoutError:
        raise BenchTimeout(what, seconds) from None


async def poll_until(
    probe: Callable[[], T | None], seconds: float, what: str, interval: float = 0.001
) -> T:
    """Poll a cheap probe until it returns something other than None or False."""
    end = time.monotonic() + seconds
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > end:
            raise BenchTimeout(what, seconds)
        await asyncio.sleep(interval)


def wait_until(probe: Callable[[], T | None], seconds: float, what: str) -> T:
    """Blocking poll, for set-up and tear-down outside the event loop (the suite's one wait)."""
    return wait_for(probe, seconds, f"bench: {what}", interval=0.01)


def _run(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, text=True, timeout=30)


@contextlib.asynccontextmanager
async def floor_server(bench: Bench) -> AsyncIterator[tuple[Path, int]]:
    """The do-nothing plugin (conformance.bench.floor) on a socket in the node: (path, pid)."""
    path = bench.root / "floor.sock"
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "conformance.bench.floor", str(path), "--slots", str(bench.slots))
    )
    bench.track(proc.pid, "floor server")
    try:
        await poll_until(path.exists, SETUP_S, "the floor server's socket", interval=0.01)
        yield path, proc.pid
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await within(proc.wait(), STOP_S, "the floor server to exit after SIGTERM")


class Bench:
    """Node, emulator and plugin of one bench run; use as a context manager."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.root = Path(tempfile.mkdtemp(prefix="hvb-", dir="/tmp"))
        self.entries: list[Entry] = [Entry("dir", str(self.root), "bench")]
        self.plugin_dir = self.root / "dp"
        self.tmpfs = self.root / "run"
        self.cdi_dir = self.tmpfs / "cdi"
        self.stage_dir = self.tmpfs / "stage"
        self.host_dev = self.root / "dev"
        self.spec_path = self.cdi_dir / SPEC_NAME
        self.kvm_rdev = os.stat("/dev/kvm").st_rdev
        self.desired = desired_spec(
            kind_name=RESOURCE, device_name="kvm", device_path="/dev/kvm", uid=65534, gid=65534
        )
        # A valid spec that differs (another writer's old version) and a torn, invalid one.
        self.stale = self.desired.replace(b"65534", b"65533")
        self.corrupt = self.desired[: len(self.desired) // 2]
        self.kubelet = ThreadedKubeletEmulator(self.plugin_dir)
        self.proc: subprocess.Popen[bytes] | None = None
        self.http_port = 0
        self.slots = 0
        self.exit_code: int | None = None
        self.stop_s: float | None = None  # SIGTERM -> exit

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
        _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where))
        self.entries.append(Entry("mount", str(where), "bench"))

    def _start(self) -> None:
        self._mount_tmpfs(self.tmpfs, "4m")
        self._mount_tmpfs(self.host_dev, "64k")
        self.cdi_dir.mkdir()
        self.stage_dir.mkdir()
        self.restore_device()
        self.kubelet.start()
        argv = [
            *("unshare", "--mount", "--propagation", "private", "--"),
            *(sys.executable, "-m", "plugin"),
            *("--device-plugin-dir", str(self.plugin_dir), "--cdi-dir", str(self.cdi_dir)),
            *("--host-dev-dir", str(self.host_dev), "--health-addr", "127.0.0.1:0"),
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
        self.entries.append(Entry("process", process_ident(self.proc.pid), "bench", "plugin"))
        wait_until(self._registered, SETUP_S, "the plugin's first successful Register")
        self.slots = wait_until(self.all_allocatable, SETUP_S, "every slot allocatable")
        wait_until(lambda: self.spec_bytes() == self.desired, SETUP_S, "the desired CDI spec")
        self.http_port = wait_until(self._port, SETUP_S, "the plugin's HTTP endpoints")
        self.tree()

    def _registered(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text()[-2000:]
            raise RuntimeError(f"plugin exited {self.proc.returncode} at start-up: {tail}")
        return any(r.ok for r in self.kubelet.registrations(RESOURCE))

    def all_allocatable(self) -> int | None:
        """The slot count once the emulator counts every slot allocatable, else None."""
        cap = self.kubelet.capacity(RESOURCE)
        return cap if cap > 0 and self.kubelet.allocatable(RESOURCE) == cap else None

    def _port(self) -> int | None:
        for line in self.log_path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                event = json.loads(line)
                if event.get("event") == "http_endpoints_listening":
                    return int(str(event["addr"]).rsplit(":", 1)[1])
        return None

    def close(self) -> list[str]:
        """Stop everything, remove everything; returns what survived (should be empty)."""
        if self.proc is not None and self.exit_code is None:
            self.tree()  # write down the probe helper too, so its end is verified
            asked = time.monotonic()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.exit_code = self.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.exit_code = self.proc.wait(STOP_S)
            self.stop_s = time.monotonic() - asked
        with contextlib.suppress(Exception):
            self.kubelet.stop()
        for entry in reversed(self.entries):
            if entry.kind == "mount" and Path(entry.ident).is_mount():
                with contextlib.suppress(subprocess.SubprocessError):
                    _run("umount", entry.ident)
        shutil.rmtree(self.root, ignore_errors=True)
        return [f"{e.kind} {e.ident} ({e.detail})" for e in survivors(self.entries)]

    # -- the plugin ----------------------------------------------------------------------

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def tree(self) -> list[int]:
        """The plugin and its descendants now; each is written down for the cleanup check."""
        pids = procfs.process_tree(self.pid)
        known = {e.ident for e in self.entries}
        for pid in pids:
            ident = process_ident(pid)
            if ident not in known:
                self.entries.append(Entry("process", ident, "bench", procfs.cmdline(pid)[:80]))
        return pids

    def track(self, pid: int, what: str) -> None:
        """Write down a helper process (reader, load generator) for the cleanup check."""
        self.entries.append(Entry("process", process_ident(pid), "bench", what))

    def socket(self) -> Path:
        """The plugin socket of its latest successful registration."""
        ok = [r for r in self.kubelet.registrations(RESOURCE) if r.ok]
        return Path(ok[-1].socket_path)

    # -- faults --------------------------------------------------------------------------

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

    def remove_device(self) -> None:
        (self.host_dev / "kvm").unlink()

    def restore_device(self) -> None:
        os.mknod(self.host_dev / "kvm", 0o600 | stat.S_IFCHR, self.kvm_rdev)
