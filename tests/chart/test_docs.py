"""The documented `helm install` commands, run as written against the chart with
`--dry-run=client` added (no cluster is reached): they render, with the image they promise."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from hvconform.manifests.chart import helm_binary
from tests.chart.helm import ROOT
from tests.container.documented import shell_commands

DOCS = ("README.md", "charts/hv-device-plugin/README.md")
DIGEST = "sha256:" + "f" * 64
COMMANDS = [
    (f"{doc}:{line}", cmd)
    for doc in DOCS
    for line, cmd in shell_commands(ROOT / doc)
    if cmd.startswith(("helm install", "helm upgrade"))
]


def test_both_clusters_are_documented() -> None:
    where = {w.split(":")[0] for w, _ in COMMANDS}
    assert where == set(DOCS)
    assert any("targets/kind.yaml" in c for _, c in COMMANDS)
    assert any("targets/aks.yaml" in c and "image.digest" in c for _, c in COMMANDS)


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_helm_install_renders(where: str, command: str, tmp_path: Path) -> None:
    env = {
        "PATH": f"{Path(helm_binary()).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "KUBECONFIG": str(tmp_path / "no-cluster"),  # nothing to reach: a dry run on the client
        "ACR": "myregistry",
        "DIGEST": DIGEST,
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", f"{command} --dry-run=client"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{where}: {done.stderr}"
    manifest = done.stdout.split("MANIFEST:", 1)[1]
    objs = [o for o in yaml.safe_load_all(manifest) if o]
    images = {
        c["image"]
        for o in objs
        if o["kind"] == "DaemonSet"
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    expected = (
        f"myregistry.azurecr.io/hv-device-plugin@{DIGEST}"
        if "image.digest" in command
        else "hv-device-plugin:0.1.0"
    )
    assert images == {expected}
