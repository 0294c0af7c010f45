"""The plugin container: hardened as a DaemonSet pod, probed through its network namespace,
faults made inside its mount namespace without any tool of the image."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hvconform.contract.ledger import (
    Entry,
    Ledger,
    mounts_at,
    read_entries,
    still_present,
    survivors,
)
from hvconform.contract.plugin import resolve
from hvconform.contract.wait import wait_for
from hvconform.targets.container.engine import DockerEngine
from hvconform.targets.container.images import ImageSet
from hvconform.targets.container.plugin_container import Bind, PluginContainer
from hvconform.targets.container.spec import container_spec

pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow]
PLUGINS, CDI, HOST_DEV = "/var/lib/kubelet/device-plugins", "/var/run/cdi", "/host-dev"


@pytest.fixture
def node_dirs() -> Iterator[Path]:
    # Short on purpose: unix socket paths must fit in 107 bytes. Shared, for rslave binds.
    root = Path(tempfile.mkdtemp(prefix="hvct-", dir="/tmp"))
    subprocess.run(["mount", "--bind", root, root], check=True)
    subprocess.run(["mount", "--make-rshared", root], check=True)
    for sub in ("plugins", "cdi", "dev", "other"):
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
    # The shipped profile's container (its chart), from this tree's image.
    spec = replace(container_spec(resolve()), image=images.plugin.tag)
    container = PluginContainer(
        host=engine.host, spec=spec, devices=["/dev/kvm"], ledger=ledger,
        binds=[Bind(node_dirs / "plugins", PLUGINS), Bind(node_dirs / "cdi", CDI),
               Bind(node_dirs / "dev", HOST_DEV, read_only=True)],
        name=f"hvct-{os.getpid()}", log_path=tmp_path / "plugin.log",
    )  # fmt: skip
    container.start()
    yield container
    container.stop()
    left = survivors(read_entries([ledger.path]))
    assert not left, left


def healthz(plugin: PluginContainer) -> bool:
    try:
        return plugin.http_get(9400, "/healthz")[0] == 200
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
    assert record["path"] == "hv-device-plugin" and record["args"] == list(plugin.spec.args or ())


def test_has_only_loopback_and_answers_healthz_through_its_netns(plugin: PluginContainer) -> None:
    devices = Path(f"/proc/{plugin.pid}/net/dev").read_text().splitlines()[2:]
    assert [line.split(":")[0].strip() for line in devices] == ["lo"]
    wait_for(lambda: healthz(plugin), 30, "/healthz through the container's netns")
    status, body = plugin.http_get(9400, "/readyz")
    assert status == 503  # no kubelet here: never registered
    assert b"registered" in body


def test_the_root_filesystem_is_read_only(plugin: PluginContainer) -> None:
    code, output = plugin.exec(["sh", "-c", "touch /opt/x 2>&1; echo rc=$?"])
    assert code == 0 and "Read-only file system" in output and "rc=1" in output


def test_writes_its_spec_through_the_bind_mount(plugin: PluginContainer, node_dirs: Path) -> None:
    spec = node_dirs / "cdi" / "hyperlight.json"
    wait_for(spec.exists, 30, "the CDI spec written from inside the container")
    assert spec.stat().st_mode & 0o777 == 0o644


def test_a_host_dir_is_bound_and_unbound_in_its_namespace_only(
    plugin: PluginContainer, node_dirs: Path
) -> None:
    (node_dirs / "other" / "marker").write_text("x")
    host_before = mounts_at(PLUGINS)
    plugin.bind_mount(node_dirs / "other", PLUGINS)
    inside = Path(f"/proc/{plugin.pid}/root{PLUGINS}")
    assert (inside / "marker").exists(), "the host dir is what the plugin sees there"
    assert not (node_dirs / "plugins" / "marker").exists(), "the node's own dir is untouched"
    assert mounts_at(PLUGINS) == host_before, "no mount on the host"
    plugin.umount(PLUGINS, lazy=True)
    assert not (inside / "marker").exists()


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
