"""The images: built with no registry, tagged by content (never latest), offline-installable."""

from __future__ import annotations

import io
import tarfile

import docker
import pytest

from hvconform.targets.container import images as img
from hvconform.targets.container.images import ImageSet

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_tags_carry_a_content_key_never_latest(images: ImageSet) -> None:
    for built in (images.base, images.plugin, images.guest):
        _, _, tag = built.tag.partition(":")
        assert tag and tag != "latest", built
        assert built.id.startswith("sha256:")
    assert images.plugin.tag.startswith("hv-device-plugin:0.")
    assert images.base.tag.endswith(img.base_key())


def test_a_second_call_builds_nothing(client: docker.DockerClient, images: ImageSet) -> None:
    again = img.ensure_images(client)
    assert again.base.id == images.base.id
    assert again.guest.id == images.guest.id
    assert again.guest.cached and again.base.cached


def test_plugin_image_entrypoint_and_offline_run(
    client: docker.DockerClient, images: ImageSet
) -> None:
    config = client.images.get(images.plugin.id).attrs["Config"]
    assert config["Entrypoint"] == ["hv-device-plugin"]
    out = client.containers.run(
        images.plugin.id, ["--help"], network_mode="none", read_only=True, cap_drop=["ALL"],
        remove=True, stdout=True, stderr=True,
    )  # fmt: skip
    assert b"--hypervisor-device" in out


def test_plugin_image_has_no_pip_and_no_wheelhouse(
    client: docker.DockerClient, images: ImageSet
) -> None:
    script = "ls /wheelhouse 2>/dev/null; python3 -m pip --version 2>/dev/null; ls /opt/hv/bin"
    out = client.containers.run(
        images.plugin.id, ["-c", script], entrypoint="sh", network_mode="none", remove=True
    ).decode()
    assert "hv-device-plugin" in out
    assert "pip " not in out and ".whl" not in out


def test_guest_image_runs_as_nobody_and_is_stdlib_only(
    client: docker.DockerClient, images: ImageSet
) -> None:
    config = client.images.get(images.guest.id).attrs["Config"]
    assert config["User"] == "65534:65534"
    assert config["Entrypoint"] == ["python3", "-m", "hvconform.guest"]
    out = client.containers.run(
        images.guest.id, ["--help"], network_mode="none", read_only=True, remove=True
    )
    assert b"Run a real guest" in out


def test_wheelhouse_holds_pip_the_backend_and_the_dependencies_not_the_project(
    images: ImageSet,
) -> None:
    """The builder's wheelhouse: the project's own wheel is made from the sources inside the
    image build (as on public CI), so a stale wheel can never be installed."""
    house = img.wheelhouse(img.CACHE_DIR, log=lambda line: None)
    names = {w.name.split("-")[0] for w in house.glob("*.whl")}
    assert {"pip", "setuptools", "grpcio", "protobuf", "asyncinotify"} <= names
    assert "prometheus_client" not in names, "the plugin writes /metrics itself"
    assert "hv_device_plugin" not in names


def test_build_context_is_deterministic() -> None:
    entries = {"b.txt": b"2", "a.txt": b"1"}
    first, second = (
        img._context(entries).getvalue(),
        img._context(dict(reversed(entries.items()))).getvalue(),
    )
    assert first == second
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        assert [m.name for m in tar.getmembers()] == ["a.txt", "b.txt"]
        assert {m.mtime for m in tar.getmembers()} == {0}
