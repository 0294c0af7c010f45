"""The exact environment of a run: kernel, distribution, cgroup version and driver, Python, the
suite's version and its checkout's source commit, the plugin's version when the plugin under test
is this repository's (a third-party plugin's identity is what ran: run.plugin_ran); then what
the target family adds (`environment(target, runtime)` of its preflight module: component
versions asked from the binaries, the cgroup driver its kubelet uses) and every precondition
finding."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from hv_device_plugin.api.names import installed_version
from hvconform.contract import hostfacts
from hvconform.contract.plugin import SHIPPED, SHIPPED_DRA, PluginUnderTest, load_profile
from hvconform.suite import preflight as preconditions
from hvconform.targets import UnknownTarget, preflight


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _os_release() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return "unknown"


def source_commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out + ("-dirty" if dirty else "")


def ours(plugin: PluginUnderTest) -> bool:
    """The plugin under test is this repository's: a shipped profile's plugin and command (the
    device plugin's, or the DRA driver's)."""
    for path in (SHIPPED, SHIPPED_DRA):
        shipped = load_profile(path)
        if plugin.name == shipped.name and plugin.command == shipped.command:
            return True
    return False


def plugin_version(plugin: PluginUnderTest) -> str:
    """This checkout's version for this repository's plugin; a third-party plugin's version is
    not ours to state (what ran, read back from it, is in run.plugin_ran)."""
    if ours(plugin):
        return installed_version()
    return "unknown: not this repository's plugin (what ran: run.plugin_ran)"


def _device(path: str) -> dict[str, Any]:
    try:
        st = os.lstat(path)
    except OSError as exc:
        return {"present": False, "error": exc.strerror or str(exc)}
    return {
        "present": True,
        "major": os.major(st.st_rdev),
        "minor": os.minor(st.st_rdev),
        "mode": oct(st.st_mode & 0o7777),
        "uid": st.st_uid,
        "gid": st.st_gid,
    }


def cgroup() -> dict[str, str]:
    """Version (v1, hybrid, v2), the host's driver (systemd or cgroupfs), controllers."""
    return {**hostfacts.cgroup_layout(), "driver": hostfacts.cgroup_driver()}


def collect() -> dict[str, Any]:
    uname = platform.uname()
    return {
        "kernel": uname.release,
        "machine": uname.machine,
        "distribution": _os_release(),
        "cgroup": cgroup(),
        "python": platform.python_version(),
        "suite_version": installed_version(),  # hvconform ships in the project's distribution
        "cpu_count": os.cpu_count() or 0,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "plugin_version": installed_version(),
        "source_commit": source_commit(),
        "devices": {"/dev/kvm": _device("/dev/kvm"), "/dev/mshv": _device("/dev/mshv")},
        "hostname": uname.node,
    }


def collect_for(target: str, runtime: str) -> dict[str, Any]:
    """collect() plus the target family's facts and the preconditions checked for this run."""
    env = collect()
    try:
        family: dict[str, Any] = preflight(target, runtime).environment(target, runtime)
    except (UnknownTarget, ModuleNotFoundError):
        family = {}
    driver = family.pop("cgroup_driver", "")
    if driver:  # the driver the target's kubelet or runtime was configured with
        env["cgroup"]["driver"] = driver
    env.update(family)
    found = preconditions.findings()
    if found:
        env["preconditions"] = found
    return env
