"""Issue 38 on KIND, LIVE: the whole catalogue on a kind node that runs containerd 2.x.

The offline node image of `nox -s kind-image -- --runtime containerd-2.3` (containerd v2.3.7 and
runc v1.4.4 built from their modules, configured in config version 3, the suite's kind config
patching CDI in both forms) gets a cluster of its own per run, made and deleted by
`hvconform run --target kind`. Every check passes or says why it cannot apply, as on the default
containerd 1.7 image, and the run's environment names the runtime as the node's daemon reports
it. Run by `nox -s kind-live` (HV_KIND_LIVE=1; the engine fixture skips otherwise).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import pytest

from hvconform.targets.kindnode import node_image
from hvconform.targets.realnode import CONTAINERD2_VERSION
from tests.fixture_plugins import GO_KVM_DIR
from tests.kindnode.live import run_kind, statuses

pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow, pytest.mark.timeout(2400)]
IMAGE = node_image("containerd-2.3")


@pytest.fixture(scope="module")
def image(engine: dict[str, Any]) -> str:
    client = engine["engine"].client()
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"{IMAGE} not built: run `nox -s kind-image -- --runtime containerd-2.3`")
    finally:
        client.close()
    return IMAGE


@pytest.mark.parametrize("plugin", ["ours", "go-kvm"])
def test_the_catalogue_passes_on_containerd_2(
    plugin: str, image: str, tmp_path: Path, engine: dict[str, Any], go_kvm: str
) -> None:
    if plugin == "ours":
        profile = ["--image", engine["tags"]["plugin"]]
    else:
        profile = ["--plugin-profile", str(GO_KVM_DIR / "profile.yaml")]
    data = run_kind(engine, tmp_path / "out", "--node-image", image, *profile)
    got = statuses(data)
    assert set(got.values()) <= {"passed", "not_applicable"}, (got, data["_output"])
    assert sum(s == "passed" for s in got.values()) >= 10, got
    # the node's runtime as its daemon says it: containerd 2.x with CDI on
    runtimes = data["environment"]["container_runtime"]
    assert runtimes, data["environment"]
    for facts in runtimes:
        # a build from the module says "2.3.7+unknown" (no release's git stamp)
        assert facts["version"].startswith(CONTAINERD2_VERSION.lstrip("v") + "+"), facts
        assert facts["cdi_enabled"] is True, facts
