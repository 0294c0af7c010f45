"""Workloads under a real container runtime: podman 4.3, the device only through CDI.

Each `podman run` happens in a private mount namespace (`unshare --mount`) where:
- a fresh tmpfs covers /run, so podman's storage, runroot and tmpdir die with the namespace
  (nothing lands in /var/lib/containers);
- the node's CDI dir is bind-mounted at /run/cdi (= /var/run/cdi) and an empty tmpfs covers
  /etc/cdi: podman 4.3 reads specs only from those two dirs, so the plugin's spec is the only
  one it sees;
- /sys/fs/cgroup/unified is unmounted: crun refuses this hybrid hierarchy otherwise.
The container runs the image's filesystem (`--rootfs`, read-only: podman has no registry to
pull from) with `--network none`, as the given uid/gid, every capability dropped and
no_new_privs, under a cgroup parent of this runtime's own that close() empties and removes.
podman's built-in rlimits (nofile=1048576) are refused on this machine, hence explicit ones.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from hvconform.contract.ledger import Ledger
from hvconform.guest.cdi_resolve import SpecError, parse_spec

ULIMITS = ("nofile=1024:1024", "nproc=1024:1024")
# podman 4.3 (Debian 12) vendors container-device-interface 0.5: it refuses every spec whose
# cdiVersion is newer than 0.5.0, even one whose content needs nothing newer (a 0.6 library
# writes the lowest version its content needs). Such a spec is shown to podman as 0.5.0, every
# other byte as the plugin wrote it, and each run says so (cdi_view); one that needs more is
# left as written, and podman refuses it as a 0.5 runtime would.
RUNTIME_CDI_VERSION = "0.5.0"
CGROUP_ROOT = Path("/sys/fs/cgroup")


CDI_06_PODMAN = (4, 7)  # the first podman vendoring container-device-interface 0.6


@functools.cache
def _podman_version() -> tuple[int, int]:
    out = subprocess.run(["podman", "--version"], capture_output=True, text=True, check=False)
    found = re.search(r"(\d+)\.(\d+)", out.stdout)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def _newer(version: str, than: str) -> bool:
    try:
        return tuple(map(int, version.split("."))) > tuple(map(int, than.split(".")))
    except ValueError:
        return False  # not a version: podman refuses it, as it should


def cgroup_mounts() -> list[Path]:
    """Every cgroup (v1 controller or v2) mount point of this namespace."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[fields.index("-") + 1] in ("cgroup", "cgroup2"):
            points.append(Path(fields[4]))
    return points


class PodmanRuntime:
    """Runs workload containers from one root filesystem; one instance per node."""

    def __init__(
        self,
        *,
        cdi_dir: Path,
        rootfs: Path,
        image_config: Mapping[str, Any],
        work_dir: Path,
        ledger: Ledger,
        label: str,
    ) -> None:
        self.cdi_dir = cdi_dir
        self.rootfs = rootfs
        self.image_env = list(image_config.get("Env") or [])
        self.entrypoint = list(image_config.get("Entrypoint") or [])
        self.ledger = ledger
        self.token = f"{label}-{secrets.token_hex(3)}"
        self.cgroup = f"hvw-{self.token}"  # the cgroup parent, in every controller
        self.conf = work_dir / "containers.conf"
        self.conf.write_text(
            "[containers]\ndefault_ulimits = [" + ", ".join(f'"{u}"' for u in ULIMITS) + "]\n"
        )
        self.work_dir = work_dir
        self._count = 0
        self._procs: list[subprocess.Popen[Any]] = []
        self.view_notes: list[str] = []  # what the last command's CDI view changed
        for mount in cgroup_mounts():
            self.ledger.record("cgroup", str(mount / self.cgroup), "podman cgroup parent")

    def new_name(self) -> str:
        self._count += 1
        return f"hvw-{self.token}-{self._count}"

    def cdi_view(self, name: str) -> Path:
        """The CDI dir podman reads for one run: the node's own, or (when a spec is only newer
        than podman accepts) a copy of it with that spec's cdiVersion lowered, nothing else."""
        lowered: dict[str, bytes] = {}
        self.view_notes = []
        if _podman_version() >= CDI_06_PODMAN:
            return self.cdi_dir
        for path in sorted(self.cdi_dir.iterdir()):
            if path.suffix != ".json" or path.is_symlink() or not path.is_file():
                continue  # never opened: a FIFO would block; podman judges these as they are
            try:
                data: Any = json.loads(path.read_bytes())
            except (OSError, ValueError):
                continue  # unreadable or malformed: podman judges it as it is
            version = data.get("cdiVersion") if isinstance(data, dict) else None
            if not isinstance(version, str) or not _newer(version, RUNTIME_CDI_VERSION):
                continue
            shown = json.dumps({**data, "cdiVersion": RUNTIME_CDI_VERSION}, indent=2) + "\n"
            try:
                parse_spec(shown, str(path))  # fails when the content needs a newer version
            except SpecError:
                continue
            lowered[path.name] = shown.encode()
            self.view_notes.append(
                f"{path.name}: cdiVersion {version} shown to podman "
                f"{'.'.join(map(str, _podman_version()))} as "
                f"{RUNTIME_CDI_VERSION} (its content needs no newer one)"
            )
        if not lowered:
            return self.cdi_dir
        view = self.work_dir / f"cdi-view-{name}"
        self.ledger.record("dir", str(view), "CDI view for podman")
        view.mkdir(mode=0o755)
        for path in sorted(self.cdi_dir.iterdir()):
            if path.is_file() and not path.is_symlink():
                (view / path.name).write_bytes(lowered.get(path.name) or path.read_bytes())
        return view

    def command(
        self,
        name: str,
        argv: Sequence[str],
        *,
        cdi_devices: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        volumes: Sequence[Path] = (),
        user: str = "65534:65534",
        extra: Sequence[str] = (),
    ) -> list[str]:
        """The full command line: unshare + namespace setup + `podman run`."""
        podman = [
            "podman",
            "--root", "/run/hvp/root", "--runroot", "/run/hvp/runroot", "--tmpdir", "/run/hvp/tmp",
            "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend", "none",
            "run", "--rm", "--name", name, "--network", "none", "--log-driver", "none",
            *(a for u in ULIMITS for a in ("--ulimit", u)),
            "--cgroup-parent", f"/{self.cgroup}", "--user", user, "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--read-only",
            *(a for d in cdi_devices for a in ("--device", d)),
            *(a for kv in self.image_env for a in ("--env", kv)),
            *(a for k, v in (env or {}).items() for a in ("--env", f"{k}={v}")),
            *(a for v in volumes for a in ("--volume", f"{v}:{v}:rw")),
            *extra,
            "--rootfs", str(self.rootfs), *self.entrypoint, *argv,
        ]  # fmt: skip
        script = "\n".join(
            [
                "set -e",
                "mount -t tmpfs -o mode=0755,size=64m hv-podman-run /run",
                "if mountpoint -q /sys/fs/cgroup/unified; then umount /sys/fs/cgroup/unified; fi",
                "if [ -d /etc/cdi ]; then mount -t tmpfs -o mode=0755,size=1m hv-etc-cdi /etc/cdi; fi",
                "mkdir /run/cdi",
                f"mount --bind {shlex.quote(str(self.cdi_view(name)))} /run/cdi",
                "exec " + shlex.join(podman),
            ]
        )
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]

    def _env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def run(
        self, name: str, argv: Sequence[str], *, timeout: float = 120.0, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run a workload to completion; output captured as text."""
        self.ledger.record("container", f"podman:{name}", "workload")
        proc = subprocess.Popen(
            self.command(name, argv, **kw), env=self._env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        self.ledger.record_process(proc.pid, f"podman run {name}")
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._terminate(proc)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(list(argv), timeout, out, err) from None
        finally:
            shutil.rmtree(self.work_dir / f"cdi-view-{name}", ignore_errors=True)
        return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        stdout: int | IO[Any] = subprocess.DEVNULL,
        **kw: Any,
    ) -> subprocess.Popen[bytes]:
        """Start a long-running workload; SIGTERM to the returned process stops it (podman
        proxies the signal to the container, then removes it)."""
        self.ledger.record("container", f"podman:{name}", "workload")
        proc = subprocess.Popen(
            self.command(name, argv, **kw), env=self._env(), stdin=subprocess.DEVNULL,
            stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.ledger.record_process(proc.pid, f"podman run {name}")
        self._procs.append(proc)
        return proc

    def _terminate(self, proc: subprocess.Popen[Any]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def cgroup_pids(self) -> set[int]:
        """Processes left under the cgroup parent (containers and their conmon)."""
        pids: set[int] = set()
        for mount in cgroup_mounts():
            top = mount / self.cgroup
            for procs in top.rglob("cgroup.procs") if top.is_dir() else []:
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in procs.read_text().split())
        return pids

    def close(self, timeout: float = 30.0) -> list[str]:
        """Stop what is still running, empty and remove the cgroup parent; returns leftovers."""
        for proc in self._procs:
            self._terminate(proc)
        deadline = time.monotonic() + timeout
        while (pids := self.cgroup_pids()) and time.monotonic() < deadline:
            # conmon exits just after `podman run --rm` returns; anything else is killed.
            if time.monotonic() > deadline - timeout / 2:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        left = [f"pids {sorted(pids)} in {self.cgroup}"] if self.cgroup_pids() else []
        for view in self.work_dir.glob("cdi-view-*"):  # those of long-running workloads
            shutil.rmtree(view, ignore_errors=True)
        for mount in cgroup_mounts():
            top = mount / self.cgroup
            if top.is_dir():
                for sub in sorted(top.rglob("*"), key=lambda p: -len(p.parts)):
                    if sub.is_dir():
                        sub.rmdir()
                top.rmdir()
            if top.exists():
                left.append(str(top))
        return left
