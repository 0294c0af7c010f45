"""File, mount and reader helpers of the local target (node areas are plain directories here)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import subprocess
import sys
from pathlib import Path

from hvconform.contract.base import NodeBase
from hvconform.contract.ledger import Ledger
from hvconform.contract.node import Area, FileInfo, ReadStats
from hvconform.contract.wait import wait_for

_KINDS = (
    (stat.S_ISREG, "file"),
    (stat.S_ISDIR, "dir"),
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISCHR, "char"),
    (stat.S_ISBLK, "block"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISSOCK, "socket"),
)


def mount(args: list[str]) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


def umount(mountpoint: Path) -> None:
    proc = subprocess.run(["umount", str(mountpoint)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"umount {mountpoint} failed: {proc.stderr.strip()}")


def mounts_below(root: Path) -> list[str]:
    """The mount points strictly below root, as this process's mount namespace lists them
    (mountinfo escapes a space as \\040)."""
    prefix = str(root) + "/"
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        points = [line.split()[4].replace("\\040", " ") for line in f]
    return [p for p in points if p.startswith(prefix)]


def device_metadata(path: str) -> dict[str, int | str]:
    """What the two-phase check compares: type, numbers, mode and owner of a device node."""
    st = os.lstat(path)
    kind = next((name for test, name in _KINDS if test(st.st_mode)), "other")
    return {
        "type": kind,
        "major": os.major(st.st_rdev),
        "minor": os.minor(st.st_rdev),
        "mode": st.st_mode & 0o7777,
        "uid": st.st_uid,
        "gid": st.st_gid,
    }


class LocalFiles:
    """The Node file operations over local directories, one per area."""

    def __init__(self, cdi: Path, host_dev: Path) -> None:
        self.dirs: dict[str, Path] = {"cdi": cdi, "host_dev": host_dev}

    def _path(self, area: Area, name: str) -> Path:
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"not a plain file name: {name!r}")
        return self.dirs[area] / name

    def read_file(self, area: Area, name: str) -> bytes | None:
        try:
            fd = os.open(self._path(area, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def write_file(self, area: Area, name: str, data: bytes) -> None:
        """Atomic (temp + rename), the way a careful injector or operator replaces a file."""
        target = self._path(area, name)
        tmp = target.with_name(f".hvconform-{os.getpid()}-{name}.tmp")
        tmp.write_bytes(data)
        tmp.chmod(0o644)
        tmp.replace(target)

    def stat_file(self, area: Area, name: str) -> FileInfo | None:
        try:
            st = os.lstat(self._path(area, name))
        except FileNotFoundError:
            return None
        kind = next((n for test, n in _KINDS if test(st.st_mode)), "other")
        return FileInfo(
            kind,
            st.st_mode & 0o7777,
            st.st_uid,
            st.st_gid,
            os.major(st.st_rdev),
            os.minor(st.st_rdev),
        )

    def remove(self, area: Area, name: str) -> None:
        self._path(area, name).unlink(missing_ok=True)

    def make_dir(self, area: Area, name: str) -> None:
        self._path(area, name).mkdir()

    def remove_dir(self, area: Area, name: str) -> None:
        self._path(area, name).rmdir()

    def list_files(self, area: Area) -> list[str]:
        return sorted(p.name for p in self.dirs[area].iterdir())

    def make_char_device(self, area: Area, name: str, major: int, minor: int) -> None:
        os.mknod(self._path(area, name), stat.S_IFCHR | 0o600, os.makedev(major, minor))

    def replace_char_device(self, area: Area, name: str, major: int, minor: int) -> None:
        """Swap a device node atomically, so no observer sees it missing in between."""
        target = self._path(area, name)
        tmp = target.with_name(f".hvconform-{name}.new")
        tmp.unlink(missing_ok=True)
        os.mknod(tmp, stat.S_IFCHR | 0o600, os.makedev(major, minor))
        tmp.replace(target)


# Unrelated CDI files planted on every node: preservation proves they stay byte-identical.
SENTINELS = {
    "zz-unrelated-vendor.json": json.dumps(
        {
            "cdiVersion": "0.5.0",
            "kind": "example.com/sentinel",
            "devices": [{"name": "s0", "containerEdits": {"env": ["SENTINEL=1"]}}],
        },
        indent=2,
    ).encode()
    + b"\n",
    "aa-operator-notes.yaml": b"# owned by the operator, never by the plugin\nkeep: true\n",
}


class HostFiles(LocalFiles, NodeBase):
    """Node state and operations every target on this host shares (local and real node)."""

    state: Path
    ledger: Ledger

    def _init_host_node(self, out_dir: Path, worker: str, plugin_cmd: str) -> None:
        self.out_dir = out_dir
        self.worker = worker
        self.plugin_cmd = (
            shlex.split(plugin_cmd) if plugin_cmd else [sys.executable, "-m", "hv_device_plugin"]
        )
        self.ledger = Ledger(out_dir / "ledger" / f"{worker}.jsonl", owner=worker)
        self.baseline_spec = b""
        self.sentinels = dict(SENTINELS)
        self.host_metadata_at_start: dict[str, int | str] = {}
        self.session_guest: str | None = None

    def stat(self, area: Area, name: str) -> FileInfo | None:
        return self.stat_file(area, name)

    def start_read_storm(self, area: Area, name: str, accepted: list[bytes]) -> ReaderStorm:
        return ReaderStorm(self.dirs[area] / name, accepted, self.state, self.ledger)

    def host_device_metadata(self) -> dict[str, int | str]:
        return device_metadata("/dev/kvm")


class ReaderStorm:
    """A separate reader process (no shared GIL with the harness) hammering one file."""

    def __init__(self, path: Path, accepted: list[bytes], state: Path, ledger: Ledger) -> None:
        self._files = []
        for i, data in enumerate(accepted):
            f = state / f"accept-{os.getpid()}-{i}"
            f.write_bytes(data)
            self._files.append(f)
        self._out = state / f"storm-{os.getpid()}.json"
        ready = state / f"storm-{os.getpid()}.ready"
        done = state / f"storm-{os.getpid()}.done"
        for marker in (ready, done):
            marker.unlink(missing_ok=True)
        args = [
            sys.executable,
            "-m",
            "hvconform.readstorm",
            str(path),
            "--out",
            str(self._out),
            "--ready",
            str(ready),
            "--done",
            str(done),
            "--min-reads",
            "1",
        ]
        for f in self._files:
            args += ["--accept", str(f)]
        self._proc = subprocess.Popen(args)
        ledger.record_process(self._proc.pid, "read storm")
        wait_for(ready.exists, 30, "read storm to start reading")
        self._markers = (ready, done)

    def stop(self) -> ReadStats:
        self._proc.send_signal(signal.SIGTERM)
        self._proc.wait(30)
        data = json.loads(self._out.read_text())
        for f in (*self._files, self._out, *self._markers):
            f.unlink(missing_ok=True)
        first_seen: dict[int, float] = {}
        for at, index in data["transitions"]:
            first_seen.setdefault(int(index), float(at))
        return ReadStats(
            reads=data["reads"],
            errors=data["errors"],
            unexpected=data["unexpected"],
            first_seen=first_seen,
            detail="; ".join(data["samples"]),
        )
