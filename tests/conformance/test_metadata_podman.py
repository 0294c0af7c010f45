"""The real effect the two-phase check guards against, on a copy of /dev/kvm (never the real one).

A device node made with mknod from the real /dev/kvm's numbers is bind-mounted into a real
container (podman, run as tests/plugin/test_cdi_podman.py runs it), so the container changes the
HOST's inode, as a KIND node's udev does to a bind-mounted /dev/kvm. Each run is also in its own
PID namespace: when podman (its init) exits, the kernel kills and reaps conmon and everything
else in it before `unshare` returns, so "no leftover process" is checked without waiting.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hvconform.metadata.rules import load_snapshot, snapshot
from hvconform.metadata.twophase import TwoPhase
from tests.plugin.test_cdi_podman import (
    INSTALL_HINT,
    cgroup_mounts,
    is_static_elf,
    processes_mentioning,
    remove_cgroup_tree,
)

pytestmark = [pytest.mark.root, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
REAL_KVM = "/dev/kvm"
# The group lookup a node would answer (getent-style line), then what its udev would do.
UDEV_CHGRP = "busybox grep '^kvm:' /etc/group && busybox chgrp kvm /dev/kvm"
CHMOD = "busybox grep '^kvm:' /etc/group && busybox chmod 0666 /dev/kvm"
PLUGIN_TESTING = "busybox stat -c '%F %t:%T %a %u:%g' /dev/kvm"


def real_kvm_state() -> tuple[int, ...]:
    """Everything a chmod/chgrp (even one put back) would leave a trace in: ctime included."""
    st = os.stat(REAL_KVM)
    return (st.st_ino, st.st_mode, st.st_uid, st.st_gid, st.st_rdev, st.st_ctime_ns)


@dataclass
class Harness:
    work: Path
    node: Path  # the host-side inode, bind-mounted at the container's /dev/kvm
    kvm_gid: int  # the container ("node") kvm group's dynamic gid
    token: str

    def container(self, command: str) -> str:
        """Run `command` in a fresh container with the node bind-mounted; return its stdout."""
        state = f"/run/{self.token}"  # /run is the namespace's own tmpfs
        podman_cmd = [
            "podman",
            *("--root", f"{state}/root", "--runroot", f"{state}/runroot"),
            *("--tmpdir", f"{state}/tmp", "--storage-driver", "vfs"),
            *("--cgroup-manager", "cgroupfs", "--events-backend", "none"),
            "run", "--rm", "--network", "none", "--log-driver", "none",
            *("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"),
            *("--cgroup-parent", f"/{self.token}"),
            *("--volume", f"{self.node}:/dev/kvm"),
            *("--rootfs", str(self.work / "rootfs"), "/bin/busybox", "sh", "-c", command),
        ]  # fmt: skip
        script = "\n".join(
            [
                "set -e",
                "mount -t tmpfs -o mode=0755 hvtest-run /run",
                # crun refuses a hybrid hierarchy whose cgroup2 part has controllers.
                "if mountpoint -q /sys/fs/cgroup/unified; then umount /sys/fs/cgroup/unified; fi",
                "exec " + shlex.join(podman_cmd),
            ]
        )
        env = {**os.environ, "CONTAINERS_CONF": str(self.work / "containers.conf")}
        argv = ["unshare", "--mount", "--propagation", "private", "--pid", "--fork"]
        argv += ["--mount-proc", "sh", "-c", script]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)
        assert proc.returncode == 0, f"container failed: {proc.stderr.strip()}"
        assert not processes_mentioning(self.token), "a container process outlived its run"
        return proc.stdout

    def cli(self, *args: str) -> tuple[int, str]:
        argv = [sys.executable, "-m", "hvconform.metadata.cli", *args]
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60)
        return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture
def harness() -> Iterator[Harness]:
    """A mknod copy of /dev/kvm, a busybox rootfs whose kvm group has a dynamic gid; checks
    afterwards that the real /dev/kvm is untouched and that nothing of the runs is left."""
    missing = [
        tool for tool in ("podman", "unshare", "mountpoint", "busybox") if not shutil.which(tool)
    ]
    assert not missing, f"needs {missing} on PATH: {INSTALL_HINT}"
    busybox = Path(shutil.which("busybox") or "")
    assert is_static_elf(busybox.resolve()), f"{busybox} is not static: {INSTALL_HINT}"
    real_before = real_kvm_state()
    real_snapshot = snapshot(REAL_KVM)
    var_lib_containers = Path("/var/lib/containers").exists()
    work = Path(tempfile.mkdtemp(prefix="hvmeta-", dir="/tmp"))
    token = f"hvmeta-{secrets.token_hex(4)}"
    node = work / "kvm"
    # The real device's numbers; a fixed root-only owner and mode, so that the expected
    # messages do not depend on what this host's udev did to its own /dev/kvm.
    os.mknod(node, stat.S_IFCHR | 0o600, os.stat(REAL_KVM).st_rdev)
    node.chmod(0o600)  # mknod's mode is masked by the umask
    # A gid no host group has, like a kvm group made dynamically inside a node image.
    kvm_gid = 100_000 + secrets.randbelow(800_000)
    rootfs = work / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "etc").mkdir()
    shutil.copy2(busybox, rootfs / "bin" / "busybox")
    (rootfs / "bin" / "sh").symlink_to("busybox")
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
    (rootfs / "etc" / "group").write_text(f"root:x:0:\nkvm:x:{kvm_gid}:\n")
    # podman 4.3's default rlimits are refused here (see test_cdi_podman): set them explicitly.
    (work / "containers.conf").write_text(
        '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
    )
    try:
        yield Harness(work, node, kvm_gid, token)
    finally:
        leftovers = processes_mentioning(token)
        remove_cgroup_tree(token)
        shutil.rmtree(work)
        assert not leftovers, leftovers
        assert not work.exists()
        assert not any((m / token).exists() for m in cgroup_mounts())
        with open("/proc/self/mountinfo") as f:
            mounts = f.read()
        assert str(work) not in mounts and token not in mounts
        assert Path("/var/lib/containers").exists() == var_lib_containers
        assert snapshot(REAL_KVM) == real_snapshot
        assert real_kvm_state() == real_before, "the REAL /dev/kvm changed during the test"


def test_node_udev_chgrp_is_accepted_then_preserved_then_restored(harness: Harness) -> None:
    h, node = harness, str(harness.node)
    original = snapshot(node)
    assert (original.kind, original.mode, original.uid, original.gid) == ("char", 0o600, 0, 0)
    two_phase = TwoPhase(device=node)
    assert two_phase.snapshot_original() == original
    code, out = h.cli("snapshot", "--device", node, "--out", str(h.work / "original.json"))
    assert code == 0, out

    lookup = h.container(UDEV_CHGRP)  # the node starts: its udev chgrp's the host inode
    assert lookup == f"kvm:x:{h.kvm_gid}:\n"
    assert os.stat(node).st_gid == h.kvm_gid, "the container did not reach the host's inode"
    (h.work / "lookup.txt").write_text(lookup)
    code, out = h.cli("snapshot", "--device", node, "--out", str(h.work / "startup.json"))
    assert code == 0, out
    code, out = h.cli(
        *("check-startup", "--original", str(h.work / "original.json")),
        *("--current", str(h.work / "startup.json"), "--group-lookup", str(h.work / "lookup.txt")),
    )
    assert code == 0, out
    assert out.startswith(f"accepted: gid changed {original.gid} -> {h.kvm_gid} at startup"), out
    assert two_phase.check_startup(lookup).status == "accepted"

    seen = h.container(PLUGIN_TESTING).split()  # plugin testing: the device is used, not changed
    assert seen[-1] == f"{original.uid}:{h.kvm_gid}"
    code, out = h.cli("snapshot", "--device", node, "--out", str(h.work / "final.json"))
    assert code == 0, out
    final_args = ("check-final", "--original", str(h.work / "original.json"))
    validated = ("--validated", str(h.work / "startup.json"))
    code, out = h.cli(*final_args, *validated, "--current", str(h.work / "final.json"))
    assert code == 0 and out.startswith("accepted: identical to the validated snapshot"), out
    assert two_phase.check_final().status == "accepted"
    summary = two_phase.summary()
    assert summary["passed"] and summary["validated"]["gid"] == h.kvm_gid

    assert original.gid is not None
    os.chown(node, -1, original.gid)  # the harness restores the host inode
    code, out = h.cli("snapshot", "--device", node, "--out", str(h.work / "restored.json"))
    assert code == 0, out
    assert load_snapshot(h.work / "restored.json") == original
    restored = ("--current", str(h.work / "restored.json"))
    code, out = h.cli(*final_args, *restored)
    assert code == 0 and "identical to the original snapshot at final" in out, out
    # Restoration is itself a change once the node's gid was validated: phase two saw it.
    code, out = h.cli(*final_args, *validated, *restored)
    assert code == 1, out
    assert out.startswith(f"rejected: gid changed {h.kvm_gid} -> {original.gid} at final"), out


def test_node_chmod_is_rejected_and_final_uses_the_original(harness: Harness) -> None:
    h, node = harness, str(harness.node)
    two_phase = TwoPhase(device=node)
    original = two_phase.snapshot_original()
    old_mode = f"{original.mode:04o}"
    assert old_mode != "0666"

    lookup = h.container(CHMOD)  # the node starts and widens the host inode's mode
    assert os.stat(node).st_mode & 0o7777 == 0o666
    startup = two_phase.check_startup(lookup)
    assert startup.status == "rejected" and startup.exit_code == 1
    assert startup.message == (
        f"rejected: mode changed {old_mode} -> 0666 at startup; "
        "rule: startup may change only the gid, and only to the node's kvm group"
    )
    assert two_phase.validated is None
    before_restore = two_phase.check_final()
    assert before_restore.status == "rejected" and before_restore.reference == "original"
    assert "(startup validation did not complete)" in before_restore.message

    assert original.mode is not None
    harness.node.chmod(original.mode)  # the harness restores the host inode
    final = two_phase.check_final()
    assert final.status == "accepted", final.message
    assert final.message.startswith(
        "accepted: identical to the original snapshot at final (startup validation did not complete)"
    )
    summary = two_phase.summary()
    assert not summary["passed"]
    assert summary["startup"]["verdict"]["status"] == "rejected"
    assert summary["final"]["current"] == original.to_json()
