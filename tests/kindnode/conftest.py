"""The kind engine the live kind tests share (tests/kindnode/live.py has their helpers)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import docker
import pytest

from hvconform.targets.cluster import kindbin
from hvconform.targets.container.engine import DockerEngine
from hvconform.targets.kindnode import NODE_IMAGE
from hvconform.targets.kindnode.engine import copy_image, inventory, kind_engine, leftovers
from hvconform.targets.realnode.node_images import build_images


@pytest.fixture(scope="module")
def engine() -> Iterator[dict[str, Any]]:
    """This project's kind engine with the plugin and guest images of `nox -s image`; what it
    held before the module, and after it nothing more. Skips outside `nox -s kind-live`."""
    if os.environ.get("HV_KIND_LIVE") != "1":
        pytest.skip("live kind clusters run in `nox -s kind-live` (HV_KIND_LIVE=1), which builds "
                    "the kind node image first")  # fmt: skip
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        pytest.skip("no dockerd/docker here: the kind engine cannot start")
    if kindbin.kind_executable() == "kind":
        pytest.skip("no kind on PATH nor in the cache: run `nox -s kind-image`")
    eng = kind_engine("tests/kindnode")
    host = eng.acquire()
    try:
        client = eng.client()
        try:
            client.images.get(NODE_IMAGE)
        except docker.errors.ImageNotFound:
            pytest.skip(f"{NODE_IMAGE} not built: run `nox -s kind-image`")
        finally:
            client.close()
        tags = build_images()
        with DockerEngine(what="tests/kindnode copy") as suite_engine:
            for tag in tags.values():
                copy_image(tag, suite_engine, eng)
        before = inventory(eng)
        yield {"engine": eng, "host": host, "tags": tags, "before": before}
        left = leftovers(eng, before)
        assert not any(left.values()), f"the live kind tests left {left}"
    finally:
        eng.release()


@pytest.fixture(scope="module")
def go_kvm(engine: dict[str, Any]) -> str:
    """go-kvm's image (built offline from its binary) copied into the kind engine."""
    from tests.container.fixture_image import ensure_in_engine
    from tests.fixture_plugins import build_go_kvm

    build_go_kvm()
    with DockerEngine(what="tests/kindnode go-kvm") as suite_engine:
        tag = ensure_in_engine(suite_engine).tag
        copy_image(tag, suite_engine, engine["engine"])
    return tag
