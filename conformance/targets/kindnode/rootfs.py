"""The node's root filesystem: debootstrap's base, trixie's containerd, the components, the
recipe of kind/node/, and the preloaded images in /var/lib/containerd; then a tar of it.

Everything happens in a staging directory below CACHE that is removed afterwards (refused while
anything is mounted below it). The images are imported by a containerd of our own (the host's
binary, CRI off, its root the staging directory's /var/lib/containerd, its socket and state in
a temporary directory), started and stopped here, so the node's containerd finds them unpacked.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from hvconform.targets.host.hostfiles import mounts_below
from hvconform.targets.kindnode import CACHE, CONTAINERD_DEB, RECIPE
from hvconform.targets.realnode import KUBERNETES_VERSION
from hvconform.targets.realnode.deps import _apt, private_apt

Log = Callable[[str], None]
# recipe file -> where it goes in the node, and its mode
LAYOUT = {
    "entrypoint": ("usr/local/bin/entrypoint", 0o755),
    "kubelet.service": ("etc/systemd/system/kubelet.service", 0o644),
    "10-kubeadm.conf": ("etc/systemd/system/kubelet.service.d/10-kubeadm.conf", 0o644),
    "10-hv-ptp.conflist": ("etc/cni/net.d/10-hv-ptp.conflist", 0o644),
    "crictl.yaml": ("etc/crictl.yaml", 0o644),
    "default-cni.yaml": ("kind/manifests/default-cni.yaml", 0o644),
    "default-storage.yaml": ("kind/manifests/default-storage.yaml", 0o644),
}
# binary name -> where it goes in the node
BINARIES = {
    "kubelet": "usr/bin/kubelet",
    "kubeadm": "usr/bin/kubeadm",
    "kubectl": "usr/bin/kubectl",
    "crictl": "usr/local/bin/crictl",
}
CNI_BIN = "opt/cni/bin"
CONTAINERD_CONFIG = "etc/containerd/config.toml"
# containerd 2.x over the package's 1.7 (which still gives the systemd unit and ctr): each program
# of the runtime's directory and where it goes, and the config version 3 it reads.
RUNTIME_PROGRAMS = {
    "containerd": "usr/bin/containerd",
    "containerd-shim-runc-v2": "usr/bin/containerd-shim-runc-v2",
    "runc": "usr/sbin/runc",
}
# Units a container has no use for (no consoles, no udev, no kernel to tune) and that would
# otherwise fail or wait at every boot.
MASKED = ("getty@tty1.service", "serial-getty@.service", "console-getty.service",
          "systemd-udevd.service", "systemd-udev-trigger.service", "systemd-modules-load.service",
          "sys-kernel-config.mount", "sys-kernel-debug.mount", "systemd-remount-fs.service",
          "systemd-journald-audit.socket")  # fmt: skip


def containerd_deb(log: Log) -> Path:
    """trixie's containerd package (cached), fetched with a private apt state as node-deps does."""
    out = CACHE / "pkgs" / f"containerd_{CONTAINERD_DEB}_amd64.deb"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    log(f"containerd {CONTAINERD_DEB}: apt-get download (trixie, private apt state)")
    with tempfile.TemporaryDirectory(prefix="hv-kind-apt-") as tmp:
        options = private_apt(Path(tmp))
        _apt(["update"], options)
        # `apt-get download` writes into its working directory: the temporary one, never the
        # caller's (a checkout would get an untracked .deb)
        _apt(["download", f"containerd={CONTAINERD_DEB}"], options, cwd=Path(tmp))
        debs = sorted(Path(tmp).glob("containerd_*.deb"))
        if len(debs) != 1:
            raise RuntimeError(f"apt-get download gave {[d.name for d in debs]}, not one .deb")
        shutil.copyfile(debs[0], f"{out}.tmp")
    Path(f"{out}.tmp").replace(out)
    return out


@contextlib.contextmanager
def staging() -> Iterator[Path]:
    (CACHE / "stage").mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="node-", dir=CACHE / "stage"))
    try:
        yield root
    finally:
        left = mounts_below(root)
        if left:  # never rm -rf through a mount
            raise RuntimeError(f"mounts left below {root}: {left}; not removing it")
        shutil.rmtree(root)


def assemble(
    root: Path,
    base_tar: Path,
    deb: Path,
    bins: dict[str, Path],
    pause: str,
    runtime_dir: Path | None = None,
) -> None:
    """Unpack the base, install containerd, put the binaries and the recipe in place; with a
    runtime_dir, its containerd 2.x, shim and runc replace the package's, with their config."""
    subprocess.run(["tar", "--numeric-owner", "-xpf", str(base_tar), "-C", str(root)], check=True)
    # dpkg's maintainer scripts write to /dev/null; the base has an empty /dev (docker fills it)
    null = root / "dev" / "null"
    os.mknod(null, 0o666 | 0o020000, os.makedev(1, 3))
    try:
        shutil.copyfile(deb, root / "tmp" / deb.name)
        subprocess.run(
            ["chroot", str(root), "dpkg", "-i", f"/tmp/{deb.name}"],
            check=True,
            capture_output=True,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive"},
        )
        # The node's own kvm group, as a node with udev has: the startup metadata check reads
        # it (`getent group kvm`); nothing in the node changes /dev/kvm (no udev runs there).
        subprocess.run(["chroot", str(root), "groupadd", "--system", "kvm"], check=True)
    finally:
        null.unlink()
        (root / "tmp" / deb.name).unlink(missing_ok=True)
    for name, at in BINARIES.items():
        _put(root / at, bins[name].read_bytes(), 0o755)
    for plugin in ("ptp", "host-local", "loopback"):
        _put(root / CNI_BIN / plugin, (bins["cni"] / plugin).read_bytes(), 0o755)
    layout = {
        **LAYOUT,
        "containerd2.toml" if runtime_dir else "containerd.toml": (CONTAINERD_CONFIG, 0o644),
    }
    for src, (at, mode) in layout.items():
        data = (RECIPE / src).read_bytes().replace(b"@PAUSE_IMAGE@", pause.encode())
        _put(root / at, data, mode)
    if runtime_dir is not None:
        for program, at in RUNTIME_PROGRAMS.items():
            _put(root / at, (runtime_dir / program).read_bytes(), 0o755)
    _put(root / "kind" / "version", f"{KUBERNETES_VERSION}\n".encode(), 0o644)
    _put(root / "etc" / "machine-id", b"", 0o444)  # each node makes its own at boot
    systemd = root / "etc" / "systemd" / "system"
    wants = systemd / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    for unit in ("kubelet.service", "containerd.service"):
        link = wants / unit
        if not link.is_symlink():
            target = "/etc/systemd/system/" if unit == "kubelet.service" else "/lib/systemd/system/"
            link.symlink_to(target + unit)
    for unit in MASKED:
        link = systemd / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")


def _put(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)


def preload(root: Path, archive: Path, log: Log) -> list[str]:
    """Import the archive into the node's containerd store; returns the names it then lists."""
    with tempfile.TemporaryDirectory(prefix="hv-kind-ctr-") as tmp:
        sock = Path(tmp) / "containerd.sock"
        conf = Path(tmp) / "config.toml"
        conf.write_text(
            "version = 2\n"
            f'root = "{root / "var/lib/containerd"}"\n'
            f'state = "{tmp}/state"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{sock}"\n'
            f'[ttrpc]\n  address = "{sock}.ttrpc"\n'
        )
        with open(Path(tmp) / "containerd.log", "wb") as out:
            proc = subprocess.Popen(
                ["containerd", "--config", str(conf)], stdout=out, stderr=out,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not sock.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("preload containerd did not start: " + _tail(tmp))
                time.sleep(0.1)
            ctr = ["ctr", "--address", str(sock), "--namespace", "k8s.io"]
            t0 = time.monotonic()
            subprocess.run(
                [*ctr, "images", "import", "--snapshotter", "overlayfs", str(archive)],
                check=True, capture_output=True, timeout=900,
            )  # fmt: skip
            log(f"preload: ctr images import in {time.monotonic() - t0:.0f}s")
            names = subprocess.run(
                [*ctr, "images", "ls", "-q"], check=True, capture_output=True, text=True
            ).stdout.split()
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return sorted(names)


def _tail(tmp: str) -> str:
    return Path(tmp, "containerd.log").read_text(errors="replace")[-600:]


def pack(root: Path, out: Path) -> None:
    """The staging directory as one tar (numeric owners, sorted: the same tree, the same tar)."""
    tmp = out.with_suffix(".tmp")
    subprocess.run(
        ["tar", "--numeric-owner", "--sort=name", "-C", str(root), "-cf", str(tmp), "."],
        check=True,
    )
    tmp.replace(out)
