"""The plugin container: hardened as a DaemonSet pod, probed through its network namespace."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.contract.ledger import Entry, Ledger, read_entries, still_present, survivors
from conformance.contract.wait import wait_for
from conformance.targets.container.engine import DockerEngine
from conformance.targets.container.images import ImageSet
from conformance.targets.container.plugin_container import PluginContainer

pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow]


@pytest.fixture
def node_dirs() -> Iterator[Path]:
    # Short on purpose: unix socket paths must fit in 107 bytes. Shared, for rslave binds.
    root = Path(tempfile.mkdtemp(prefix="hvct-", dir="/tmp"))
    subprocess.run(["mount", "--bind", root, root], check=True)
    subprocess.run(["mount", "--make-rshared", root], check=True)
    for sub in ("plugins", "cdi", "dev"):
        (root / sub).mkdir()
    kvm = os.stat("/dev/kvm").st_rdev
    os.mknod(root / "dev" / "kvm", 0o020600, kvm)
    yield root
    subprocess.run(["umount", root], check=True)
    shutil.rmtree(root)


@pytest.fixture
def plugin(
    engine: DockerEngine, images: ImageSet, node_dirs: Path, tmp_path: Path
) -> Iterator[PluginContainer]:
    ledger = Ledger(tmp_path / "ledger.jsonl", owner="test")
    container = PluginContainer(
        host=engine.host, image=images.plugin.tag,
        argv=["--device-plugin-dir", str(node_dirs / "plugins"), "--cdi-dir", str(node_dirs / "cdi"),
              "--host-dev-dir", str(node_dirs / "dev"), "--health-addr", "127.0.0.1:8080"],
        binds=[node_dirs / "plugins", node_dirs / "cdi", node_dirs / "dev"], ledger=ledger,
        name=f"hvct-{os.getpid()}", log_path=tmp_path / "plugin.log", health_port=8080,
    )  # fmt: skip
    container.start()
    yield container
    container.stop()
    left = survivors(read_entries([ledger.path]))
    assert not left, left


def healthz(plugin: PluginContainer) -> bool:
    try:
        return plugin.http_get("/healthz")[0] == 200
    except OSError:
        return False


def test_runs_with_no_capabilities_and_no_new_privileges(plugin: PluginContainer) -> None:
    caps = plugin.capabilities()
    assert caps == {
        "CapInh": 0,
        "CapPrm": 0,
        "CapEff": 0,
        "CapBnd": 0,
        "CapAmb": 0,
        "NoNewPrivs": 1,
    }
    record = plugin.records[-1]
    assert record["read_only_rootfs"] is True and record["privileged"] is False
    assert record["network_mode"] == "none" and record["cap_drop"] == ["ALL"]
    assert record["devices"] == ["/dev/kvm:/dev/kvm:rw"]


def test_has_only_loopback_and_answers_healthz_through_its_netns(plugin: PluginContainer) -> None:
    devices = Path(f"/proc/{plugin.pid}/net/dev").read_text().splitlines()[2:]
    assert [line.split(":")[0].strip() for line in devices] == ["lo"]
    wait_for(lambda: healthz(plugin), 30, "/healthz through the container's netns")
    status, body = plugin.http_get("/readyz")
    assert status == 503  # no kubelet here: never registered
    assert b"registered" in body


def test_the_root_filesystem_is_read_only(plugin: PluginContainer) -> None:
    res = plugin.in_mount_ns(["sh", "-c", "touch /opt/x 2>&1; echo rc=$?"])
    assert "Read-only file system" in res.stdout and "rc=1" in res.stdout


def test_writes_its_spec_through_the_bind_mount(plugin: PluginContainer, node_dirs: Path) -> None:
    spec = node_dirs / "cdi" / "hyperlight.json"
    wait_for(spec.exists, 30, "the CDI spec written from inside the container")
    assert spec.stat().st_mode & 0o777 == 0o644


def test_restart_replaces_the_container_and_removes_the_old_one(plugin: PluginContainer) -> None:
    # Started first: as PID 1 the plugin ignores SIGTERM until its handler is installed.
    wait_for(lambda: healthz(plugin), 30, "/healthz before the restart")
    first = plugin.container_id
    plugin.restart()
    assert plugin.container_id != first
    gone = Entry("container", f"docker:{first}", "test", f"host={plugin.host}")
    assert not still_present(gone)
    assert still_present(Entry("container", f"docker:{plugin.name}", "test", f"host={plugin.host}"))
    assert plugin.records[0]["exit_code"] == 0  # SIGTERM: a clean stop
