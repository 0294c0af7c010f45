"""LIVE against a real API server (`node-up --nodes 1`): a run deletes exactly what it created.

A profile of this repository's plugin (the chart's render as manifest files) plus objects a
profile author may write: a ConfigMap and a ClusterRole with generateName, and a
ClusterRoleBinding to the built-in ClusterRole `view` that the user opts in. The cluster's
ClusterRoleBindings and CRDs are counted before and after: the same. Then a run killed with
SIGKILL right after its apply leaves labelled objects, which `hvconform cleanup --run-id`
removes (and nothing else). Runs in `nox -s cluster-safety-live` (apart from `tests` for CI's
time). Needs the node built (`nox -s node-build`; skipped with that reason
when it is not) and no other node up on this machine.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hvconform.contract.plugin import SHIPPED
from hvconform.targets.cluster.access import STATE_DIR
from hvconform.targets.cluster.kube import KubeApi
from hvconform.targets.cluster.workloads import RUN_ID_LABEL
from hvconform.targets.realnode import NODE_NAME
from tests.realnode.live_runs import cluster_mode_nodes, live_module, run_output, skip_unless_live

# the machine's one node stack, locked only when this module really runs (apart from `tests`,
# it would only wait for the lock to skip: 208 s of a CI worker, measured)
USES_NODE_STACK = live_module("HV_CLUSTER_SAFETY_LIVE")
pytestmark = pytest.mark.timeout(1800)
RBAC = "rbac.authorization.k8s.io/v1"


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    skip_unless_live("HV_CLUSTER_SAFETY_LIVE", "cluster-safety-live")
    with cluster_mode_nodes(1) as made:
        yield made


def _profile(tmp_path: Path, image: str) -> Path:
    """The shipped profile with its objects as manifest files, plus a profile author's."""
    rendered = subprocess.run(
        [sys.executable, "-m", "hvconform.cli", "manifests", "--target", "kind",
         "--image", image],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    (tmp_path / "chart.yaml").write_text(rendered)
    extra = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "", "generateName": "hv-settings-"},
            "data": {"a": "b"},
        },
        {
            "apiVersion": RBAC,
            "kind": "ClusterRole",
            "metadata": {"generateName": "hv-reader-"},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}],
        },
        {
            "apiVersion": RBAC,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "", "generateName": "hv-view-"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "view",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "default", "namespace": "hyperlight-system"}
            ],
        },
    ]
    (tmp_path / "extra.yaml").write_text(yaml.safe_dump_all(extra))
    profile = yaml.safe_load(SHIPPED.read_text())
    profile["deploy"] = {
        "image": image,
        "manifests": {"*": ["chart.yaml", "extra.yaml"]},
        "pods": profile["deploy"]["pods"],
    }
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def _argv(cluster: dict[str, str], profile: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hvconform.cli",
        "run",
        "--target",
        "cluster",
        "--kubeconfig",
        cluster["kubeconfig"],
        "--node",
        NODE_NAME,
        "--node-access",
        "direct",
        "--plugin-profile",
        str(profile),
        "--guest-image",
        cluster["guest"],
        "--allow-object",
        "ClusterRoleBinding/hv-view-",
        "--out",
        str(out),
        *extra,
    ]


def _counts(api: KubeApi) -> dict[str, int]:
    return {
        "clusterrolebindings": len(api.list_objects(RBAC, "ClusterRoleBinding")),
        "clusterroles": len(api.list_objects(RBAC, "ClusterRole")),
        "crds": len(api.list_objects("apiextensions.k8s.io/v1", "CustomResourceDefinition")),
        "namespaces": len(api.list_objects("v1", "Namespace")),
    }


LABELLED_KINDS = (
    (RBAC, "ClusterRoleBinding"),
    (RBAC, "ClusterRole"),
    ("v1", "Namespace"),
    ("v1", "ConfigMap"),
    ("apps/v1", "DaemonSet"),
)


def _labelled(api: KubeApi) -> list[str]:
    found = []
    for api_version, kind in LABELLED_KINDS:
        items = api.list_objects(api_version, kind, labels=RUN_ID_LABEL)
        found += [f"{kind} {o['metadata']['name']}" for o in items]
    return found


def test_generated_and_opted_in_objects_are_deleted_exactly(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    api = KubeApi(cluster["kubeconfig"])
    try:
        before = _counts(api)
        profile = _profile(tmp_path, cluster["plugin"])
        out = tmp_path / "run"
        proc = subprocess.run(
            _argv(cluster, profile, out, "-m", "guest"),
            capture_output=True,
            text=True,
            timeout=1500,
        )
        assert proc.returncode == 0, run_output(proc, out)
        report: dict[str, Any] = json.loads((out / "cluster-cluster.json").read_text())
        assert report["cleanup_ok"], report["verification"]
        assert report["environment"]["opted_in"][0].startswith("ClusterRoleBinding/hv-view-")
        made = [json.loads(line) for line in (out / "cluster" / "cluster-objects.jsonl").open()]
        generated = [m["name"] for m in made if m["kind"] in ("ClusterRoleBinding", "ConfigMap")]
        assert len(generated) == 2 and all(re.search(r"-[a-z0-9]{5}$", n) for n in generated)
        assert _counts(api) == before
        assert _labelled(api) == []
        print(f"counts before and after: {before}; generated names: {generated}")
    finally:
        api.close()


def test_a_killed_run_is_cleaned_up_by_its_label(cluster: dict[str, str], tmp_path: Path) -> None:
    api = KubeApi(cluster["kubeconfig"])
    try:
        before = _counts(api)
        out = tmp_path / "killed"
        proc = subprocess.Popen(
            _argv(cluster, _profile(tmp_path, cluster["plugin"]), out, "-m", "guest"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        ledger = out / "cluster" / "cluster-objects.jsonl"
        deadline = time.monotonic() + 600
        while not (ledger.exists() and "ClusterRoleBinding" in ledger.read_text()):
            assert proc.poll() is None, "the run ended before its apply"
            assert time.monotonic() < deadline, "wait 'the run applied its binding' expired"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        printed, _ = proc.communicate(timeout=60)
        hint = re.search(r"hvconform cleanup .*--run-id (\S+)", printed)
        assert hint, printed[-2000:]
        left = _labelled(api)
        assert any(x.startswith("ClusterRoleBinding hv-view-") for x in left), left
        report = json.loads((out / "cluster-cluster.json").read_text())
        assert any("hvconform cleanup" in note for note in report["notes"]), report["notes"]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "hvconform.cli",
                "cleanup",
                "--kubeconfig",
                cluster["kubeconfig"],
                "--run-id",
                hint.group(1),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        swept = json.loads(done.stdout)
        assert swept["left"] == [] and len(swept["deleted"]) >= 4, swept
        assert _labelled(api) == []
        assert _counts(api) == before
        print(f"left by SIGKILL: {left}; cleanup: {swept}; counts before and after: {before}")
    finally:
        api.close()
        # the node's state dir is the node's, not the cluster's: what the killed run's
        # node-prepare made there is removed as its node-restore step would have
        subprocess.run(["rm", "-rf", STATE_DIR], check=True)
