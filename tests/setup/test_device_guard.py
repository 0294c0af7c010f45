"""scripts/device-guard: a package install may not change the host's hypervisor devices.

Against a real character device made with mknod (the numbers of /dev/null: opening it would be
harmless) and a stand-in "apt-get" whose post-install trigger re-applies a device rule the way
udev's did (chgrp to a kvm group, mode 0660): the guard puts mode, owner and group back, says so
loudly on stderr, and keeps the command's exit code; a device it cannot restore is exit 3. The
bootstrap runs every apt install through it. The real /dev/kvm is checked unchanged throughout.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.setup.support import REPO

GUARD = REPO / "scripts" / "device-guard"
KVM_GROUP = 36  # Debian's kvm group id when udev creates it; any gid other than 0 will do
pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, chown)"),
]


def metadata(path: str | Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


@pytest.fixture(autouse=True)
def real_kvm_unchanged() -> Iterator[None]:
    before = metadata("/dev/kvm")
    yield
    assert metadata("/dev/kvm") == before, "the real /dev/kvm changed"


@pytest.fixture
def device(tmp_path: Path) -> Path:
    dev = tmp_path / "kvm"
    null = os.stat("/dev/null").st_rdev
    os.mknod(dev, 0o600 | stat.S_IFCHR, os.makedev(os.major(null), os.minor(null)))
    dev.chmod(0o600)  # mknod's mode is masked by the umask
    return dev


def trigger(tmp_path: Path, body: str, code: int = 0) -> Path:
    """A stand-in `apt-get` whose post-install trigger runs body (sh), then exits code."""
    script = tmp_path / "apt-get"
    script.write_text(f"#!/bin/sh\necho 'Setting up udev ...'\n{body}\nexit {code}\n")
    script.chmod(0o755)
    return script


def guard(device: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HV_GUARD_DEVICES": f"{device} {device.parent / 'absent'}"}
    return subprocess.run(
        [str(GUARD), *argv], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def test_a_trigger_that_chgrps_and_chmods_is_undone_loudly(tmp_path: Path, device: Path) -> None:
    apt = trigger(tmp_path, f"chgrp {KVM_GROUP} '{device}' && chmod 0660 '{device}'")
    res = guard(device, "--", str(apt), "install", "-y", "chromium")
    assert metadata(device) == (0o600, 0, 0)
    assert res.returncode == 0, res.stderr  # the install's own exit code
    assert f"device-guard: !!! {apt} install -y chromium changed {device}" in res.stderr
    assert f"mode/uid/gid 600 0 0 -> 660 0 {KVM_GROUP}; restoring" in res.stderr
    assert f"device-guard: {device} restored to 600 0:0" in res.stderr
    assert "Setting up udev" in res.stdout  # the command's output is left alone


def test_a_failed_install_keeps_its_exit_code_and_is_still_undone(
    tmp_path: Path, device: Path
) -> None:
    apt = trigger(tmp_path, f"chown 65534:65534 '{device}'", code=100)
    res = guard(device, "--", str(apt), "install", "udev")
    assert res.returncode == 100
    assert metadata(device) == (0o600, 0, 0) and "restoring" in res.stderr


def test_a_device_that_cannot_be_restored_is_exit_3(tmp_path: Path, device: Path) -> None:
    apt = trigger(tmp_path, f"rm '{device}'")
    res = guard(device, "--", str(apt), "install", "udev")
    assert res.returncode == 3
    assert f"changed {device}: mode/uid/gid 600 0 0 -> gone" in res.stderr
    assert f"could not restore {device} to 600 0:0; fix it by hand" in res.stderr


def test_an_install_that_touches_nothing_is_silent(tmp_path: Path, device: Path) -> None:
    res = guard(device, "--", str(trigger(tmp_path, "true", code=0)), "install", "crun")
    assert (res.returncode, res.stderr) == (0, "")
    assert metadata(device) == (0o600, 0, 0)


def test_usage_error_is_exit_2(device: Path) -> None:
    for argv in ([], ["apt-get"], ["--"]):
        res = guard(device, *argv)
        assert res.returncode == 2 and res.stderr.startswith("usage: device-guard -- CMD")


def test_default_devices_are_the_host_hypervisors(tmp_path: Path) -> None:
    """Without HV_GUARD_DEVICES the guard watches /dev/kvm and /dev/mshv; a command that leaves
    them alone leaves them exactly as they were (the autouse fixture checks /dev/kvm)."""
    env = {k: v for k, v in os.environ.items() if k != "HV_GUARD_DEVICES"}
    res = subprocess.run(
        [str(GUARD), "--", "stat", "-c", "%a", "/dev/kvm"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0 and res.stderr == ""
    assert res.stdout.strip() == f"{metadata('/dev/kvm')[0]:o}"


def test_bootstrap_installs_only_through_the_guard() -> None:
    """Every apt-get install in scripts/bootstrap goes through apt_install, which runs the
    guard; nox -s node-deps installs through it too."""
    text = (REPO / "scripts" / "bootstrap").read_text()
    installs = [ln.strip() for ln in text.splitlines() if "apt-get install" in ln]
    assert installs and all(ln.startswith("scripts/device-guard -- apt-get") for ln in installs)
    deps = (REPO / "conformance" / "targets" / "realnode" / "deps.py").read_text()
    assert '[str(GUARD), "--", "apt-get", "install"' in deps


def test_the_conformance_bootstrap_needs_no_go_nor_container_engines(tmp_path: Path) -> None:
    """`./dev conform` bootstraps only what the local target needs (issue 27: it stopped with
    "go is needed" and installed chromium, podman, docker.io and debootstrap)."""
    root = Path(__file__).resolve().parents[2]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("bash", "dpkg-query", "grep", "dirname", "id", "python3"):
        found = shutil.which(tool)
        assert found, tool
        (bindir / tool).symlink_to(found)
    env = {"PATH": str(bindir), "HOME": str(tmp_path), "HV_PYTHON": sys.executable}
    conform = subprocess.run([str(root / "scripts" / "bootstrap"), "conform"], env=env,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert conform.returncode == 0, conform.stderr
    test = subprocess.run([str(root / "scripts" / "bootstrap"), "test"], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert test.returncode == 1 and "go is needed" in test.stderr, test.stderr
    text = (root / "scripts" / "bootstrap").read_text()
    conform_packages = text.split("if [[ $MODE == conform ]]; then", 1)[1].split("fi", 1)[0]
    for heavy in ("docker.io", "podman", "chromium", "debootstrap"):
        assert heavy not in conform_packages, heavy
