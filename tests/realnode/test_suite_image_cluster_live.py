"""Issue 36 LIVE: the suite's image judges a cluster from inside a container, as the CLI does.

A user without Python runs `docker run <suite image> run --target cluster --kubeconfig ...`
against their cluster. Here the cluster is `node-up --nodes 1` (a real API server, kubelet,
containerd with CDI), the image is the one `nox -s suite-image` builds offline, and the same
selection runs twice on the same node: once with the CLI of this checkout, once in the image
(host network for the loopback API server, the host's PID namespace and /dev/kvm read-only so
that the two-phase metadata check judges the node's device, the kubeconfig and its
certificates read-only, the report written to a mounted directory). Every check's verdict
must be the same, and each run must clean up after itself (the cluster report's
verification).

Run by `nox -s suite-image` (HV_SUITE_IMAGE_LIVE=1): apart from `tests` for CI's time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hvconform.targets.realnode import NODE_NAME, STATE
from tests.realnode.live_runs import cluster_mode_nodes, live_module, run_output, skip_unless_live

ENV = "HV_SUITE_IMAGE_LIVE"
USES_NODE_STACK = live_module(ENV)  # conftest: one node stack at a time on this machine
pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def image() -> Iterator[tuple[str, str]]:
    """The suite's image (built, or found by its key) in the suite's engine: (its id, the
    engine's host)."""
    skip_unless_live(ENV, "suite-image")
    from hvconform.manifests.chart import helm_binary
    from hvconform.targets.container.engine import DockerEngine
    from hvconform.targets.kindnode import suite_image

    with DockerEngine(what="tests/realnode suite image") as engine:
        client = engine.client(timeout=1800)
        try:
            built, _ = suite_image.ensure_suite_image(client, helm=Path(helm_binary()))
        finally:
            client.close()
        yield built.id, engine.host


@pytest.fixture(scope="module")
def cluster(image: tuple[str, str]) -> Iterator[dict[str, str]]:
    with cluster_mode_nodes(1) as made:
        yield made


def _args(cluster: dict[str, str], kubeconfig: str, out: str) -> list[str]:
    return [
        "run", "--target", "cluster", "--kubeconfig", kubeconfig, "--node", NODE_NAME,
        "--node-access", "pod", "--image", cluster["plugin"], "--guest-image", cluster["guest"],
        "--diag-image", cluster["guest"], "--out", out,
    ]  # fmt: skip


def _read(out: Path, proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert (out / "results.json").exists(), run_output(proc, out)
    data: dict[str, Any] = json.loads((out / "results.json").read_text())
    report = json.loads((out / "cluster-cluster.json").read_text())
    assert report["cleanup_ok"], report["verification"]
    return data


def test_the_image_gives_the_clis_verdicts_on_a_cluster(
    image: tuple[str, str], cluster: dict[str, str], tmp_path: Path
) -> None:
    image_id, host = image
    cli_out = tmp_path / "cli"
    t0 = time.monotonic()
    cli = subprocess.run(
        [sys.executable, "-m", "hvconform.cli", *_args(cluster, cluster["kubeconfig"], str(cli_out))],
        capture_output=True, text=True, timeout=2000,
    )  # fmt: skip
    cli_s = time.monotonic() - t0
    from_cli = _read(cli_out, cli)

    in_image = tmp_path / "image"
    in_image.mkdir()
    pki = STATE / "pki"
    t0 = time.monotonic()
    container = subprocess.run(
        # on the node: its PID namespace (the suite finds the node's kubelet, so the node's
        # /dev/kvm is this machine's) and the device itself, read-only, for the two phases
        ["docker", "run", "--rm", "--network", "host", "--pid", "host", "--read-only",
         "--tmpfs", "/tmp", "--env", "HOME=/tmp", "--volume", "/dev/kvm:/dev/kvm:ro",
         "--volume", f"{cluster['kubeconfig']}:/kube/config:ro",
         "--volume", f"{pki}:{pki}:ro",
         "--volume", f"{in_image}:/out",
         image_id, *_args(cluster, "/kube/config", "/out/run")],
        capture_output=True, text=True, timeout=2000, env={**os.environ, "DOCKER_HOST": host},
    )  # fmt: skip
    image_s = time.monotonic() - t0
    print(f"cluster target, pod route: CLI {cli_s:.0f} s, suite image {image_s:.0f} s")
    from_image = _read(in_image / "run", container)

    verdicts = [{c["id"]: c["status"] for c in d["checks"]} for d in (from_cli, from_image)]
    assert verdicts[0] == verdicts[1], verdicts
    assert "passed" in verdicts[0].values() and "failed" not in verdicts[0].values(), verdicts[0]
    assert verdicts[1]["metadata-two-phase"] == "passed", verdicts[1]
    assert cli.returncode == container.returncode == 0, run_output(container, in_image / "run")
    # the image's run names the suite it ran: its version, and the build information
    env = from_image["environment"]
    assert env["suite_version"] == from_cli["environment"]["suite_version"]
    assert from_image["run"]["plugin"]["name"] == from_cli["run"]["plugin"]["name"]
