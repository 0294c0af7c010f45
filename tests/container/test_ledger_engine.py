"""Ledger entries of kind container and image are verified by asking the engine."""

from __future__ import annotations

import io
import secrets
import subprocess
import tarfile
from pathlib import Path

import docker
import pytest

from hvconform.contract.ledger import Entry, Ledger, read_entries, still_present
from hvconform.targets.container.engine import DockerEngine
from hvconform.targets.container.images import ImageSet

pytestmark = [pytest.mark.root]


def test_a_docker_container_is_present_until_removed(
    engine: DockerEngine, client: docker.DockerClient, images: ImageSet, tmp_path: Path
) -> None:
    name = f"hvtest-ledger-{secrets.token_hex(4)}"
    ledger = Ledger(tmp_path / "l.jsonl", owner="t")
    ledger.record("container", f"docker:{name}", f"host={engine.host}")
    (entry,) = read_entries([ledger.path])
    assert not still_present(entry)
    container = client.containers.create(images.base.id, ["true"], name=name, network_mode="none")
    try:
        assert still_present(entry)
        assert still_present(
            Entry("container", f"docker:{container.id}", "t", f"host={engine.host}")
        )
    finally:
        container.remove(force=True)
    assert not still_present(entry)


def test_a_test_only_image_is_present_until_removed(
    engine: DockerEngine, client: docker.DockerClient, images: ImageSet
) -> None:
    context = io.BytesIO()
    dockerfile = f"FROM {images.base.tag}\nLABEL hvtest={secrets.token_hex(8)}\n".encode()
    with tarfile.open(fileobj=context, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    context.seek(0)
    tag = f"hvtest-ledger:{secrets.token_hex(4)}"
    image, _ = client.images.build(
        fileobj=context, custom_context=True, tag=tag, network_mode="none", pull=False
    )
    image_id = str(image.id)
    entry = Entry("image", f"docker:{image_id}", "t", f"host={engine.host}")
    try:
        assert still_present(entry)
    finally:
        client.images.remove(image_id, force=True)
    assert not still_present(entry)


def test_with_the_engine_down_its_data_root_answers(tmp_path: Path) -> None:
    cid = "ab" * 32
    (tmp_path / "containers" / cid).mkdir(parents=True)
    (tmp_path / "containers" / cid / "config.v2.json").write_text('{"Name":"/hvc-x-1"}')
    detail = f"host=unix://{tmp_path}/no.sock data_root={tmp_path}"
    assert still_present(Entry("container", "docker:hvc-x-1", "t", detail))
    assert still_present(Entry("container", f"docker:{cid}", "t", detail))
    assert not still_present(Entry("container", "docker:hvc-x-10", "t", detail))
    assert not still_present(Entry("image", f"docker:sha256:{cid}", "t", detail))


def test_a_podman_container_is_present_while_a_process_names_it() -> None:
    assert not still_present(Entry("container", f"podman:hvw-{secrets.token_hex(6)}", "t"))
    with pytest.raises(ValueError, match="unknown engine"):
        still_present(Entry("container", "lxc:x", "t"))


def test_a_stopped_engine_leaves_no_mount_below_its_exec_root() -> None:
    """dockerd keeps its default network namespace bind-mounted in its exec root after a clean
    shutdown (exec/netns/default, seen left on this machine after a CI run): the engine's stop
    removes what its own daemon mounted there, and nothing else."""
    import shutil
    import tempfile

    from hvconform.targets.host.hostfiles import mounts_below

    top = Path(tempfile.mkdtemp(prefix="hve-", dir="/run"))  # short: socket paths below it
    try:
        with DockerEngine(what="tests/container stop", data_root=top / "d", exec_root=top / "x"):
            assert (top / "x" / "started-by-hvconform").exists()
            # what dockerd leaves: a network namespace bind-mounted at exec/netns/default (a
            # fresh daemon that ran no container makes none, so it is made here as it does)
            default = top / "x" / "netns" / "default"
            default.parent.mkdir(exist_ok=True)
            default.touch()
            subprocess.run(["mount", "--bind", "/proc/self/ns/net", str(default)], check=True)
            assert mounts_below(top / "x") == [str(default)]
        assert not (top / "x" / "started-by-hvconform").exists()  # stopped by this user
        assert mounts_below(top) == []
    finally:
        left = mounts_below(top)
        shutil.rmtree(top, ignore_errors=not left)
        assert not left, left
