"""What a kubelet leaves on the host beyond its own dirs, and how node-down removes it: its
kubepods cgroups, its iptables chains, and a root dir that will not go (named, with why).

Split from `stack` so that its teardown reads as one list; nothing here knows the stack's
processes.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

CGROUP_V1 = Path("/sys/fs/cgroup")
# Chains a kubelet makes when makeIPTablesUtilChains is on (the default); removed if ever seen.
KUBELET_CHAINS = ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT")


def kubepods_cgroups() -> list[Path]:
    if not CGROUP_V1.is_dir():
        return []
    return [
        p for c in CGROUP_V1.iterdir() for p in (c / "kubepods", c / "kubepods.slice") if p.is_dir()
    ]


def rm_cgroup(path: Path) -> None:
    for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        sub.rmdir()
    path.rmdir()


def remove_root(root: Path) -> str:
    """Remove one root; '' when gone, else what stood in the way (retried while it changes:
    a process of the stack that was still exiting may have written there after the rmtree)."""
    errors: list[str] = []

    def removed() -> bool:
        errors.clear()
        shutil.rmtree(root, onerror=lambda _f, path, exc: errors.append(f"{path}: {exc[1]}"))
        return not root.exists()

    with contextlib.suppress(FileNotFoundError):
        if removed():
            return ""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            if removed():
                return ""
        time.sleep(0.2)  # pacing the retries of a removal, not a synchronisation
    inside = sorted(str(p.relative_to(root)) for p in root.rglob("*"))[:5] if root.exists() else []
    return f"directory {root} not removable: {'; '.join(errors[:3])}; holds {inside}"


def iptables_leftovers() -> list[tuple[str, str, str]]:
    """(tool, table, chain) of kubelet chains present in iptables and ip6tables."""
    found = []
    for tool in ("iptables", "ip6tables"):
        if shutil.which(f"{tool}-save") is None:
            continue
        table = ""
        for line in subprocess.run(
            [f"{tool}-save"], capture_output=True, text=True
        ).stdout.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":") and line[1:].split()[0] in KUBELET_CHAINS:
                found.append((tool, table, line[1:].split()[0]))
    return found


def remove_iptables_leftovers() -> None:
    for tool, table, chain in iptables_leftovers():
        for parent in ("INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"):
            while (
                subprocess.run(
                    [tool, "-t", table, "-D", parent, "-j", chain], capture_output=True
                ).returncode
                == 0
            ):
                pass
        subprocess.run([tool, "-t", table, "-F", chain], capture_output=True)
        subprocess.run([tool, "-t", table, "-X", chain], capture_output=True)
