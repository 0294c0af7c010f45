"""Facts of this host every target family checks or reports: root, the hypervisor device, the
cgroup layout, free TCP ports and the Go toolchain a build needs. Each is a Requirement (see
`preconditions`) or a plain value for the environment. Standard library only.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import socket
import stat
from collections.abc import Sequence
from pathlib import Path

from hvconform.contract.preconditions import Found, Requirement, tool

KVM_GET_API_VERSION = 0xAE00  # _IO(KVMIO, 0x00)
KVM_API_VERSION = 12  # the only one Linux has ever shipped
CGROUP_ROOT = Path("/sys/fs/cgroup")
_CGROUP_FIX = "mount the cgroup hierarchy at /sys/fs/cgroup (a systemd or container default)"


def root(feature: str) -> Requirement:
    def probe() -> Found:
        uid = os.geteuid()
        return Found(f"uid {uid}", uid == 0, "geteuid()")

    return Requirement("root", feature, "uid 0", "run as root (sudo ./dev conform)", probe)


def kvm(feature: str, path: str = "/dev/kvm") -> Requirement:
    """A character device that opens read-write and answers KVM_GET_API_VERSION with 12."""

    def probe() -> Found:
        try:
            st = os.lstat(path)
        except OSError as exc:
            return Found(f"no {path} ({exc.strerror})", False, f"lstat {path}")
        if not stat.S_ISCHR(st.st_mode):
            return Found(f"{path} that is not a character device", False, f"lstat {path}")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            return Found(f"{path} that does not open ({exc.strerror})", False, f"open {path}")
        try:
            version = fcntl.ioctl(fd, KVM_GET_API_VERSION)
        except OSError as exc:
            return Found(f"{path} refusing KVM_GET_API_VERSION ({exc.strerror})", False, path)
        finally:
            os.close(fd)
        return Found(f"KVM API {version}", version == KVM_API_VERSION, "KVM_GET_API_VERSION")

    return Requirement(
        "/dev/kvm",
        feature,
        f"a usable character device (KVM API {KVM_API_VERSION})",
        "load kvm (modprobe kvm_intel or kvm_amd) on a machine with hardware virtualisation",
        probe,
    )


def cgroup_layout() -> dict[str, str]:
    """version: v2 (unified), hybrid (v1 controllers plus a v2 mount) or v1; controllers."""
    v1: list[str] = []
    v2 = False
    for line in _mountinfo():
        fields = line.split()
        fstype = fields[fields.index("-") + 1] if "-" in fields else ""
        point = fields[4] if len(fields) > 4 else ""
        if not point.startswith(str(CGROUP_ROOT)):
            continue
        if fstype == "cgroup2":
            v2 = True
        elif fstype == "cgroup":
            v1 += [o for o in fields[-1].split(",") if o not in ("rw", "ro")]
    version = "none" if not (v1 or v2) else ("v2" if not v1 else ("hybrid" if v2 else "v1"))
    controllers = sorted(set(v1) - {"name=systemd", "nsdelegate"}) if v1 else _v2_controllers()
    return {"version": version, "controllers": ",".join(controllers)}


def _v2_controllers() -> list[str]:
    try:
        return sorted((CGROUP_ROOT / "cgroup.controllers").read_text().split())
    except OSError:
        return []


def _mountinfo() -> list[str]:
    try:
        return Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []


def cgroup_driver() -> str:
    """Who manages the cgroup tree on this host: systemd when it is the init system."""
    return "systemd" if Path("/run/systemd/system").is_dir() else "cgroupfs"


def cgroups(feature: str, controllers: Sequence[str]) -> Requirement:
    def probe() -> Found:
        layout = cgroup_layout()
        have = set(layout["controllers"].split(","))
        missing = [c for c in controllers if c not in have]
        found = f"cgroup {layout['version']}" + (
            f" without {', '.join(missing)}" if missing else f" ({layout['controllers']})"
        )
        return Found(found, layout["version"] != "none" and not missing, "/proc/self/mountinfo")

    need = f"cgroup v1 or v2 with {', '.join(controllers)}"
    return Requirement("cgroups", feature, need, _CGROUP_FIX, probe)


def free_ports(feature: str, ports: Sequence[int], host: str = "127.0.0.1") -> Requirement:
    """Every port bindable on host (SO_REUSEADDR, as servers bind: TIME_WAIT is no obstacle)."""

    def probe() -> Found:
        busy = []
        for port in ports:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((host, port))
                except OSError as exc:
                    if exc.errno != errno.EADDRINUSE:
                        raise
                    busy.append(str(port))
        found = f"{host} ports {', '.join(busy)} in use" if busy else "all free"
        return Found(found, not busy, "bind()")

    listed = ", ".join(str(p) for p in ports)
    fix = f"stop what listens there (ss -ltnp | grep -E ':({'|'.join(str(p) for p in ports)})')"
    return Requirement("TCP ports", feature, f"{host} ports {listed} free", fix, probe)


def go_toolchain(go_mod: Path, feature: str) -> Requirement:
    """Go at least the `go` directive of go_mod (what `go build` there demands)."""
    match = re.search(r"^go (\d+\.\d+(?:\.\d+)?)", go_mod.read_text(), re.MULTILINE)
    minimum = match.group(1) if match else "1.21"
    return tool(
        "go",
        ["go", "version"],
        minimum=minimum,
        feature=feature,
        fix=f"install Go >= {minimum} and put its bin directory on PATH",
        pattern=r"go(\d+\.\d+(?:\.\d+)?)",
    )
