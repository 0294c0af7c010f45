"""Shared fixtures: the harness's Docker engine, the built images, the guest's root filesystem.

Everything here needs root, the engine (docker.io) and, for a cold cache, debootstrap and
Debian's mirror: scripts/bootstrap installs the tools. Missing tools fail, never skip.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from hvconform.targets.container.engine import DockerEngine
from hvconform.targets.container.images import ImageSet, ensure_images, export_rootfs
from tests.container.fixture_image import FixtureImage, ensure_go_kvm_image

INSTALL_HINT = "scripts/bootstrap (apt-get install docker.io debootstrap podman)"


@pytest.fixture(scope="session")
def engine() -> Iterator[DockerEngine]:
    missing = [t for t in ("dockerd", "containerd", "debootstrap", "podman") if not shutil.which(t)]
    if missing:
        pytest.fail(f"container tests need {missing}: {INSTALL_HINT}")
    with DockerEngine(what="tests/container") as eng:
        yield eng


@pytest.fixture(scope="session")
def client(engine: DockerEngine) -> Iterator[docker.DockerClient]:
    c = engine.client(timeout=600)
    yield c
    c.close()


@pytest.fixture(scope="session")
def images(client: docker.DockerClient) -> ImageSet:
    return ensure_images(client)


@pytest.fixture(scope="session")
def guest_rootfs(client: docker.DockerClient, images: ImageSet) -> Path:
    return export_rootfs(client, images.guest)


@pytest.fixture(scope="session")
def go_kvm_image(client: docker.DockerClient) -> FixtureImage:
    """The go-kvm fixture's image (built offline, cached), as its profile names it."""
    return ensure_go_kvm_image(client)
