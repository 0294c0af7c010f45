"""CdiReconciler against real files, real special files and real tmpfs mounts (needs root)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hv_device_plugin.cdi import CdiReconciler, CdiStatus, desired_spec

pytestmark = pytest.mark.root

NAME = "hyperlight.json"
DESIRED = desired_spec(device_name="kvm", device_path="/dev/kvm")
STALE = desired_spec(device_name="kvm", device_path="/dev/kvm", uid=1000, gid=1000)


def snapshot(directory: Path) -> dict[str, tuple[str, str, int]]:
    """Every entry below directory (except NAME at the top): type, content hash/target, mode."""
    out: dict[str, tuple[str, str, int]] = {}
    for root, dirs, files in os.walk(directory):
        for entry in dirs + files:
            path = Path(root, entry)
            rel = str(path.relative_to(directory))
            if rel == NAME:
                continue
            st = path.lstat()
            if stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                digest = str(path.readlink())
            else:
                digest = ""
            out[rel] = (stat.filemode(st.st_mode), digest, st.st_ino)
    return out


@pytest.fixture
def cdi_dir(tmp_path: Path) -> Iterator[Path]:
    """A CDI dir full of other files that must come out byte-identical, with no litter."""
    d = tmp_path / "cdi"
    d.mkdir()
    (d / "other-vendor.json").write_bytes(desired_spec(device_name="mshv", device_path="/x"))
    (d / "vendor.yaml").write_text("cdiVersion: 0.5.0\nkind: v.com/c\n")
    (d / "broken.json").write_bytes(b"{broken")
    (d / ".hidden.json.tmp-1-abc").write_bytes(b"someone else's temp file")
    (d / "sub").mkdir()
    (d / "sub" / NAME).write_bytes(STALE)
    (d / "sub" / "inner.yaml").write_bytes(b"x: 1\n")
    before = snapshot(d)
    yield d
    assert snapshot(d) == before


@pytest.fixture
def rec(cdi_dir: Path) -> CdiReconciler:
    return CdiReconciler(cdi_dir, NAME, DESIRED)


def assert_desired(path: Path) -> None:
    st = path.lstat()
    assert stat.S_ISREG(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o644
    assert path.read_bytes() == DESIRED


def test_missing_is_created(rec: CdiReconciler) -> None:
    assert rec.inspect() == CdiStatus("missing", reason=f"{rec.path} does not exist")
    status = rec.reconcile()
    assert status == CdiStatus("desired", repaired=True, cause="missing")
    assert status.ok and status.reason == ""
    assert_desired(rec.path)
    assert rec.reconcile() == CdiStatus("desired")
    assert rec.inspect().ok


@pytest.mark.parametrize(
    ("content", "cause"),
    [
        (b"{not json", "malformed"),
        (b"", "malformed"),
        (DESIRED.replace(b'"kind"', b'"kinds"'), "malformed"),
        (b"x" * (2 << 20), "malformed"),
        (STALE, "stale"),
        (DESIRED.rstrip(b"\n"), "stale"),
        (DESIRED + b"\n", "stale"),
    ],
)
def test_wrong_content_is_rewritten(rec: CdiReconciler, content: bytes, cause: str) -> None:
    rec.path.write_bytes(content)
    assert rec.inspect().state == cause
    assert rec.path.read_bytes() == content  # inspect changes nothing
    assert rec.reconcile() == CdiStatus("desired", repaired=True, cause=cause)
    assert_desired(rec.path)


@pytest.mark.parametrize("mode", [0o600, 0o664, 0o755, 0o4644, 0o1644, 0o444])
def test_wrong_mode_is_rewritten_not_chmodded(
    rec: CdiReconciler, tmp_path: Path, mode: int
) -> None:
    rec.path.write_bytes(DESIRED)
    rec.path.chmod(mode)
    # A hard link elsewhere shares the inode: a rewrite leaves it alone, a chmod would not.
    other = tmp_path / "hardlink"
    os.link(rec.path, other)
    assert rec.inspect().state == "wrong_mode"
    assert rec.reconcile() == CdiStatus("desired", repaired=True, cause="wrong_mode")
    assert_desired(rec.path)
    assert stat.S_IMODE(other.lstat().st_mode) == mode
    assert other.lstat().st_ino != rec.path.lstat().st_ino


def test_mode_is_exact_under_a_narrow_umask(rec: CdiReconciler) -> None:
    old = os.umask(0o077)
    try:
        assert rec.reconcile().repaired
    finally:
        os.umask(old)
    assert_desired(rec.path)


@pytest.mark.parametrize("target_content", [DESIRED, STALE, None])
def test_symlink_is_not_followed(
    rec: CdiReconciler, tmp_path: Path, target_content: bytes | None
) -> None:
    target = tmp_path / "elsewhere.json"
    if target_content is not None:
        target.write_bytes(target_content)
        target.chmod(0o600)
    rec.path.symlink_to(target)
    for status in (rec.inspect(), rec.reconcile(), rec.reconcile()):
        assert status.state == "obstructed" and not status.repaired
        assert "is a symlink" in status.reason
    assert rec.path.readlink() == target
    if target_content is None:
        assert not target.exists()
    else:
        assert target.read_bytes() == target_content
        assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_directory_obstructs_then_recovers(rec: CdiReconciler) -> None:
    rec.path.mkdir()
    (rec.path / "keep").write_bytes(b"k")
    status = rec.reconcile()
    assert status.state == "obstructed" and "is a directory" in status.reason
    assert (rec.path / "keep").read_bytes() == b"k"
    (rec.path / "keep").unlink()
    rec.path.rmdir()
    assert rec.reconcile() == CdiStatus("desired", repaired=True, cause="missing")
    assert_desired(rec.path)


def test_fifo_obstructs_without_blocking(rec: CdiReconciler) -> None:
    os.mkfifo(rec.path)
    status = rec.reconcile()
    assert status.state == "obstructed" and "a FIFO" in status.reason
    assert stat.S_ISFIFO(rec.path.lstat().st_mode)


def test_socket_obstructs(rec: CdiReconciler) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        # Bind through the directory fd path so long tmp paths stay under sun_path's limit.
        dir_fd = os.open(rec.cdi_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            sock.bind(f"/proc/self/fd/{dir_fd}/{NAME}")
        finally:
            os.close(dir_fd)
        status = rec.reconcile()
        assert status.state == "obstructed" and "a socket" in status.reason
        assert stat.S_ISSOCK(rec.path.lstat().st_mode)
        rec.path.unlink()
    assert rec.reconcile().repaired


@pytest.mark.parametrize(("kind", "word"), [(stat.S_IFCHR, "character"), (stat.S_IFBLK, "block")])
def test_device_node_obstructs(rec: CdiReconciler, kind: int, word: str) -> None:
    os.mknod(rec.path, kind | 0o644, os.makedev(1, 3))
    status = rec.reconcile()
    assert status.state == "obstructed" and f"a {word} device" in status.reason
    assert rec.path.lstat().st_rdev == os.makedev(1, 3)
    rec.path.unlink()


def test_missing_directory_is_an_error_and_not_created(tmp_path: Path) -> None:
    rec = CdiReconciler(tmp_path / "absent", NAME, DESIRED)
    status = rec.reconcile()
    assert status.state == "error" and "does not exist" in status.reason
    assert not (tmp_path / "absent").exists()


def test_directory_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    status = CdiReconciler(tmp_path / "link", NAME, DESIRED).reconcile()
    assert status.state == "error" and "is a symlink; refusing to follow" in status.reason
    assert list(real.iterdir()) == []


def test_symlink_in_an_intermediate_component_is_resolved(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "cdi").mkdir()
    (tmp_path / "var-run").symlink_to(tmp_path / "run")
    assert CdiReconciler(tmp_path / "var-run" / "cdi", NAME, DESIRED).reconcile().repaired
    assert_desired(tmp_path / "run" / "cdi" / NAME)


def test_concurrent_reconciles_repair_once(rec: CdiReconciler) -> None:
    start = threading.Barrier(16)
    results: list[CdiStatus] = []
    lock = threading.Lock()

    def worker() -> None:
        start.wait(timeout=10)
        status = rec.reconcile()
        with lock:
            results.append(status)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 16 and all(r.ok for r in results)
    assert sum(r.repaired for r in results) == 1
    assert_desired(rec.path)


def test_constructor_rejects_bad_input(tmp_path: Path) -> None:
    for filename in ("", "a/b.json", "..", "spec.txt", "spec.json.tmp"):
        with pytest.raises(ValueError):
            CdiReconciler(tmp_path, filename, DESIRED)
    with pytest.raises(ValueError, match="desired CDI spec is invalid"):
        CdiReconciler(tmp_path, NAME, b"{}")


def mounted(mountpoint: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(mountpoint) for line in f)


@contextmanager
def tmpfs(mountpoint: Path, options: str) -> Iterator[Path]:
    """A real tmpfs on mountpoint, always unmounted and checked gone from mountinfo."""
    mountpoint.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "hvtest", str(mountpoint)], check=True)
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)
        assert not mounted(mountpoint)


def test_read_only_storage_errors_deterministically_then_recovers(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "size=1m,mode=0755") as d:
        assert mounted(d)
        (d / "sentinel.json").write_bytes(b"{}")
        rec = CdiReconciler(d, NAME, DESIRED)
        subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
        first = rec.reconcile()
        assert first.state == "error" and first.cause == "missing" and not first.repaired
        assert "EROFS" in first.reason and "create temp file" in first.reason
        assert rec.reconcile() == first
        assert rec.inspect().state == "missing"
        subprocess.run(["mount", "-o", "remount,rw", str(d)], check=True)
        assert rec.reconcile() == CdiStatus("desired", repaired=True, cause="missing")
        assert_desired(d / NAME)
        (d / NAME).write_bytes(STALE)
        subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
        stale = rec.reconcile()
        assert stale.state == "error" and stale.cause == "stale" and "EROFS" in stale.reason
        assert (d / NAME).read_bytes() == STALE
        subprocess.run(["mount", "-o", "remount,rw", str(d)], check=True)
        assert rec.reconcile().repaired
        assert sorted(p.name for p in d.iterdir()) == sorted([NAME, "sentinel.json"])
        assert (d / "sentinel.json").read_bytes() == b"{}"


def test_full_storage_leaves_no_temp_file(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "full", "size=4k,mode=0755") as d:
        fd = os.open(d / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            with pytest.raises(OSError, match="No space left"):
                while True:
                    os.write(fd, b"\0" * 4096)
        finally:
            os.close(fd)
        rec = CdiReconciler(d, NAME, DESIRED)
        status = rec.reconcile()
        assert status.state == "error" and "ENOSPC" in status.reason, status
        assert [p.name for p in d.iterdir()] == ["filler"]
        (d / "filler").unlink()
        assert rec.reconcile().repaired
        assert [p.name for p in d.iterdir()] == [NAME]


def test_spec_is_valid_json_for_runtimes(rec: CdiReconciler) -> None:
    rec.reconcile()
    spec = json.loads(rec.path.read_bytes())
    assert spec["devices"][0]["name"] == "kvm"


def _fstype_from_mountinfo(path: Path) -> str:
    """The filesystem type of the mount holding `path`, as /proc/self/mountinfo says."""
    best, kind = "", ""
    real = str(path.resolve())
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mount_point = fields[4].replace("\\040", " ")
        fstype = fields[fields.index("-") + 1]
        inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, kind = mount_point, fstype
    return kind


@pytest.mark.parametrize("where", ["/dev/shm", "/run", "/tmp", "/work", "/proc/self"])
def test_memory_backed_agrees_with_the_mount_table(where: str) -> None:
    """Repairs run on the loop only where statfs says tmpfs or ramfs: checked against
    /proc/self/mountinfo, an independent source, for whatever these paths are here."""
    if not Path(where).is_dir():
        pytest.skip(f"{where} is not a directory on this machine")
    reconciler = CdiReconciler(
        Path(where), "hyperlight.json", desired_spec(device_name="kvm", device_path="/dev/kvm")
    )
    assert reconciler.memory_backed() == (_fstype_from_mountinfo(Path(where)) in ("tmpfs", "ramfs"))
