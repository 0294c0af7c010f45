"""CDI repair in the running plugin: allocation-triggered, obstruction, read-only storage."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.plugin.plugin_process import Node, PluginProcess, Stream, wait_for

SPEC = "hyperlight.json"


def _mounted(path: Path) -> bool:
    needle = f" {path} "
    return any(needle in line for line in Path("/proc/self/mountinfo").read_text().splitlines())


def _replace_with_dir(path: Path) -> None:
    """Put a directory where the spec is; the plugin may repair in between, so retry."""
    deadline = time.monotonic() + 10
    while True:
        try:
            path.unlink(missing_ok=True)
            path.mkdir()
            return
        except FileExistsError:
            if time.monotonic() > deadline:
                raise


@pytest.fixture
def stream(plugin: PluginProcess) -> Iterator[Stream]:
    s = Stream(plugin.socket())
    wait_for(plugin.ready, 10, "readiness")
    yield s
    s.cancel()


def test_stale_spec_repaired_by_allocate_before_answer(
    plugin: PluginProcess, node: Node, stream: Stream
) -> None:
    spec = node.cdi_dir / SPEC
    desired = spec.read_bytes()
    sentinel = node.cdi_dir / "other-vendor.json"
    sentinel.write_bytes(b'{"unrelated": true}\n')
    before = hashlib.sha256(sentinel.read_bytes()).hexdigest()
    for _ in range(20):
        stale = desired.replace(b"65534", b"65535")
        tmp = node.cdi_dir / ".inject"
        tmp.write_bytes(stale)
        tmp.rename(spec)  # atomic, like the fault injector: no ENOENT window
        plugin.allocate("kvm-0")
        assert spec.read_bytes() == desired, "Allocate answered before the spec was repaired"
        assert spec.stat().st_mode & 0o7777 == 0o644
    assert hashlib.sha256(sentinel.read_bytes()).hexdigest() == before


@pytest.mark.parametrize("damage", ["missing", "malformed", "stale", "mode"])
def test_watch_repairs_without_allocate(
    plugin: PluginProcess, node: Node, stream: Stream, damage: str
) -> None:
    spec = node.cdi_dir / SPEC
    desired = spec.read_bytes()
    if damage == "missing":
        spec.unlink()
    elif damage == "malformed":
        spec.write_bytes(b"{not json")
    elif damage == "stale":
        spec.write_bytes(desired.replace(b"kvm", b"kvn", 1))
    else:
        spec.chmod(0o600)
    wait_for(
        lambda: (
            spec.exists() and spec.read_bytes() == desired and spec.stat().st_mode & 0o777 == 0o644
        ),
        5,
        f"repair of {damage} spec by the watcher",
    )


def test_directory_at_spec_path_is_unhealthy_then_recovers(
    plugin: PluginProcess, node: Node, stream: Stream
) -> None:
    spec = node.cdi_dir / SPEC
    _replace_with_dir(spec)
    (spec / "keep").write_text("x")
    wait_for(lambda: stream.healthy_count() == 0, 10, "unhealthy snapshot for a directory at spec")
    status, body = plugin.http("/readyz")
    assert status == 503 and "directory" in body["conditions"]["cdi"]["reason"]
    assert (spec / "keep").read_text() == "x", "obstruction must never be removed"
    pid = plugin.proc.pid
    (spec / "keep").unlink()
    spec.rmdir()
    wait_for(lambda: stream.healthy_count() == 4, 10, "recovery after the directory was removed")
    assert plugin.proc.pid == pid and plugin.proc.poll() is None


def test_read_only_storage_refuses_then_recovers(
    plugin: PluginProcess, node: Node, stream: Stream
) -> None:
    # An empty read-only tmpfs over the CDI dir: the spec is missing and cannot be written.
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "hv-ro", str(node.cdi_dir)], check=True
    )
    try:
        wait_for(lambda: plugin.http("/readyz")[0] == 503, 15, "readiness false on read-only CDI")
        body = plugin.http("/readyz")[1]
        assert (
            "Read-only" in body["conditions"]["cdi"]["reason"]
            or "EROFS" in body["conditions"]["cdi"]["reason"]
        )
        assert plugin.http("/healthz")[0] == 200, "liveness must stay true"
        with pytest.raises(grpc.RpcError) as err:
            plugin.allocate("kvm-0")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "cdi" in (err.value.details() or "")
        pid = plugin.proc.pid
        subprocess.run(["mount", "-o", "remount,rw", str(node.cdi_dir)], check=True)
        wait_for(plugin.ready, 15, "readiness after remount read-write")
        assert (node.cdi_dir / SPEC).exists()
        assert plugin.proc.pid == pid
        plugin.allocate("kvm-0")
    finally:
        subprocess.run(["umount", str(node.cdi_dir)], check=True)
    assert not _mounted(node.cdi_dir)


def test_symlink_at_spec_path_not_followed(
    plugin: PluginProcess, node: Node, stream: Stream, tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_bytes(b"precious\n")
    spec = node.cdi_dir / SPEC
    link = node.cdi_dir / ".link"
    os.symlink(target, link)
    link.rename(spec)  # atomic swap, as an attacker would do it: no window for a repair
    wait_for(lambda: stream.healthy_count() == 0, 10, "unhealthy snapshot for a symlink at spec")
    assert target.read_bytes() == b"precious\n" and spec.is_symlink()
    spec.unlink()
    wait_for(lambda: stream.healthy_count() == 4, 10, "recovery after the symlink was removed")
    assert target.read_bytes() == b"precious\n"
