"""A real CDI consumer (podman) resolves the reconciled spec into a usable /dev/kvm.

podman 4.3 reads specs only from /etc/cdi and /var/run/cdi, so each run happens in a private
mount namespace where a fresh tmpfs covers /run (all runtime state dies with the namespace) and
the test's CDI dir is bind-mounted at /run/cdi. Storage, runroot and tmpdir live in that tmpfs;
containers run with --rootfs (no image, no registry, no blob cache) under a cgroup parent of
our own that is removed afterwards. Needs root, podman (crun or runc) and a static busybox.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hv_device_plugin.cdi import CdiReconciler, desired_spec, qualified_name

pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow]

INSTALL_HINT = "apt-get install -y podman busybox-static"
KVM_RDEV = (10, 232)
# Inside the container: node type, major:minor (hex), owner, mode, env, and an rw open.
PROBE = (
    'busybox stat -c "%F %t:%T %u:%g %a" /dev/kvm;'
    ' echo "HV=$HYPERLIGHT_HYPERVISOR DP=$HYPERLIGHT_DEVICE_PATH";'
    " [ -c /dev/kvm ] && exec 3<>/dev/kvm && echo opened-rw"
)
Run = Callable[..., subprocess.CompletedProcess[str]]


def is_static_elf(path: Path) -> bool:
    """True for a 64-bit ELF without a PT_INTERP segment, i.e. runnable in an empty rootfs."""
    data = path.read_bytes()
    if data[:5] != b"\x7fELF\x02":
        return False
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return all(struct.unpack_from("<I", data, phoff + i * phentsize)[0] != 3 for i in range(phnum))


def cgroup_mounts() -> list[Path]:
    with open("/proc/self/mountinfo") as f:
        fields = [line.split() for line in f]
    return [Path(x[4]) for x in fields if x[x.index("-") + 1] in ("cgroup", "cgroup2")]


def remove_cgroup_tree(name: str) -> None:
    for mount in cgroup_mounts():
        top = mount / name
        if top.is_dir():
            for root, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
                Path(root).rmdir()


def processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def listing(directory: Path) -> list[str] | None:
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else None


@pytest.fixture
def podman(tmp_path: Path) -> Iterator[Run]:
    """A runner of `podman run` against tmp_path/cdi; verifies and cleans up everything after."""
    missing = [
        tool for tool in ("podman", "unshare", "mountpoint", "busybox") if not shutil.which(tool)
    ]
    if missing:
        pytest.fail(f"podman CDI test needs {missing} on PATH: {INSTALL_HINT}")
    busybox = Path(shutil.which("busybox") or "")
    if not is_static_elf(busybox.resolve()):
        pytest.fail(f"{busybox} is not statically linked: {INSTALL_HINT}")
    if not Path("/dev/kvm").exists():
        pytest.fail("the host has no /dev/kvm for the CDI spec to resolve")
    work = tmp_path / "podman"
    (work / "rootfs/bin").mkdir(parents=True)
    shutil.copy2(busybox, work / "rootfs/bin/busybox")
    (work / "rootfs/bin/sh").symlink_to("busybox")
    # podman 4.3's built-in rlimits (nofile=1048576, nproc=32768) are refused with EPERM in a
    # sandbox like this one; set both explicitly, in a private containers.conf and on the CLI.
    conf = work / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n')
    token = f"hvtest-{secrets.token_hex(4)}"
    cgroup, state = token, f"/run/{token}"  # /run is the namespace's own tmpfs
    var_lib_containers = Path("/var/lib/containers").exists()
    host_cdi = listing(Path("/run/cdi"))

    def run(cdi_dir: Path, *podman_args: str) -> subprocess.CompletedProcess[str]:
        podman_cmd = [
            "podman",
            *("--root", f"{state}/root", "--runroot", f"{state}/runroot"),
            *("--tmpdir", f"{state}/tmp", "--storage-driver", "vfs"),
            *("--cgroup-manager", "cgroupfs", "--events-backend", "none"),
            "run", "--rm", "--network", "none", "--log-driver", "none",
            *("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"),
            *("--cgroup-parent", f"/{cgroup}"),
            *podman_args,
            *("--rootfs", str(work / "rootfs"), "/bin/busybox", "sh", "-c", PROBE),
        ]  # fmt: skip
        script = "\n".join(
            [
                "set -e",
                "mount -t tmpfs -o mode=0755 hvtest-run /run",
                # crun refuses a hybrid hierarchy whose cgroup2 part has controllers.
                "if mountpoint -q /sys/fs/cgroup/unified; then umount /sys/fs/cgroup/unified; fi",
                "if [ -d /etc/cdi ]; then mount -t tmpfs -o mode=0755 hvtest-etc-cdi /etc/cdi; fi",
                "mkdir /run/cdi",
                f"mount --bind {shlex.quote(str(cdi_dir))} /run/cdi",
                "exec " + shlex.join(podman_cmd),
            ]
        )
        env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
        return subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)

    try:
        yield run
    finally:
        deadline = time.monotonic() + 30
        while processes_mentioning(token) and time.monotonic() < deadline:
            time.sleep(0.05)  # conmon exits just after `podman run --rm` returns
        leftovers = processes_mentioning(token)
        remove_cgroup_tree(cgroup)
        shutil.rmtree(work)
        assert not leftovers, leftovers
        assert not any((m / cgroup).exists() for m in cgroup_mounts())
        with open("/proc/self/mountinfo") as f:
            assert str(tmp_path) not in f.read()
        assert Path("/var/lib/containers").exists() == var_lib_containers
        assert listing(Path("/run/cdi")) == host_cdi


def kvm_device() -> str:
    return qualified_name("hyperlight.dev/hypervisor", "kvm")


def expect_kvm(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, f"podman failed: {result.stderr.strip()}"
    lines = result.stdout.split("\n")
    major, minor = (f"{n:x}" for n in KVM_RDEV)
    assert lines[0] == f"character special file {major}:{minor} 65534:65534 666", result.stdout
    assert lines[1] == "HV=kvm DP=/dev/kvm"
    assert lines[2] == "opened-rw"


def test_podman_resolves_the_reconciled_spec(podman: Run, tmp_path: Path) -> None:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "broken.json").write_bytes(b"{ an unrelated broken spec")
    (cdi / "hyperlight.json").write_bytes(b"stale garbage")
    rec = CdiReconciler(
        cdi, "hyperlight.json", desired_spec(device_name="kvm", device_path="/dev/kvm")
    )
    assert rec.reconcile().repaired
    expect_kvm(podman(cdi, "--device", kvm_device()))
    assert rec.inspect().ok


def test_podman_without_the_device_gets_no_kvm(podman: Run, tmp_path: Path) -> None:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    result = podman(cdi)
    assert result.returncode != 0
    assert "/dev/kvm" in result.stdout + result.stderr


@pytest.mark.parametrize(("version", "resolves"), [("0.5.0", True), ("0.6.0", False)])
def test_podman_4_3_cdi_version_support(
    podman: Run, tmp_path: Path, version: str, resolves: bool
) -> None:
    """Why the default is 0.5.0: Debian 12's podman cannot read 0.6.0 specs."""
    version_out = subprocess.run(["podman", "--version"], capture_output=True, text=True)
    if not version_out.stdout.startswith("podman version 4.3."):
        pytest.skip(f"version support recorded for podman 4.3, have {version_out.stdout}")
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    spec = desired_spec(device_name="kvm", device_path="/dev/kvm", cdi_version=version)
    CdiReconciler(cdi, "hyperlight.json", spec).reconcile()
    result = podman(cdi, "--device", kvm_device())
    if resolves:
        expect_kvm(result)
    else:
        assert result.returncode != 0
        assert f"unresolvable CDI devices {kvm_device()}" in result.stderr
