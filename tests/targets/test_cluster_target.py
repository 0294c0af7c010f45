"""The existing-cluster target without a cluster: what it applies, its options, its plan, and
that kind and AKS hand their shared part over to it (the live runs are tests/realnode's).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hvconform.targets import build_plan, cluster_options
from hvconform.targets.cluster.access import DirectAccess, NodeAccessError, local_kubelet
from hvconform.targets.cluster.existing import ExistingLifecycle, parse
from hvconform.targets.cluster.plan import ClusterOptions, Step
from tests.targets.conftest import RUN_ID, recorded_objects

KUBECONFIG = Path(__file__).resolve().parents[2] / "fixtures" / "plans" / "kubeconfig.yaml"


def options(**kw: Any) -> ClusterOptions:
    base: dict[str, Any] = {
        "target": "cluster",
        "image": "hv-device-plugin:0.1.0",
        "run_id": RUN_ID,
        "kubeconfig": str(KUBECONFIG),
        "nodes": ("hv-node",),
        "resource_group": "rg",
        "cluster": "aks",
    }
    base.update(kw)
    return ClusterOptions(**base)


def test_the_shipped_profile_applies_what_hvconform_manifests_prints(tmp_path: Path) -> None:
    """Our plugin reaches the cluster through its profile (charts/hv-device-plugin, the run's
    namespace and image): the objects are exactly the chart's render `hvconform manifests`
    prints, and the text kept next to the report is those objects."""
    o = options(workdir=str(tmp_path))
    lifecycle = ExistingLifecycle(o)
    printed = subprocess.run(
        [sys.executable, "-m", "hvconform.cli", "manifests", "--target", "kind",
         "--image", o.image, "--namespace", o.plugin_namespace],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    printed_objects = parse(printed)
    # The chart's Namespace is replaced by the run's own (blast radius: a run never applies a
    # profile's Namespace), which keeps its pod-security labels; everything else as printed.
    chart_ns = [obj for obj in printed_objects if obj["kind"] == "Namespace"]
    rendered = [obj for obj in printed_objects if obj["kind"] != "Namespace"]
    assert parse(lifecycle.text) == rendered
    applied = [obj for obj in lifecycle.objects if obj in rendered]
    assert applied == rendered
    added = [obj for obj in lifecycle.objects if obj not in rendered]
    assert {o["kind"] for o in added} == {"Namespace"}
    assert {o["metadata"]["name"] for o in added} == {
        o.plugin_namespace,
        o.work_namespace,
        f"hvconform-diag-{RUN_ID}",
    }
    own = next(x for x in added if x["metadata"]["name"] == o.plugin_namespace)
    security = "pod-security.kubernetes.io/enforce"
    assert own["metadata"]["labels"][security] == chart_ns[0]["metadata"]["labels"][security]
    assert own["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "hvconform"
    assert not lifecycle.layout.host_view_isolated  # the real /dev view stays as rendered


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kubeconfig": ""}, "needs --kubeconfig"),
        ({"kubeconfig": "/nonexistent/kubeconfig"}, "not a readable file"),
        ({"nodes": ()}, "--node NAME"),
        ({"all_nodes": True}, "--node NAME"),
        ({"nodes": ("Bad_Name",)}, "not a Kubernetes node name"),
        ({"node_access": "ssh"}, "one of pod, direct, host-pid"),
    ],
)
def test_unusable_cluster_options_are_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cluster_options("cluster", options(**change))


def test_the_cli_refuses_a_missing_kubeconfig_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hvconform.cli", "run", "--target", "cluster", "--node", "n1",
         "--kubeconfig", str(tmp_path / "absent"), "--out", str(tmp_path / "out")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "not a readable file" in proc.stderr
    assert not (tmp_path / "out").exists()


def _shape(step: Step) -> tuple[Any, ...]:
    """A step without its node commands (the route differs: docker exec, pod exec, here) and
    its manifest (kind applies the harness's isolated host-device view; the cluster target the
    rendered objects unchanged: test_the_manifests_applied_are_...)."""
    return (step.id, step.phase, step.what, step.api, step.arms)


def test_kind_is_the_cluster_target_plus_its_own_create_and_delete() -> None:
    kind = cluster_options("kind", options(target="kind", keep_cluster=True))
    objects = recorded_objects(kind.plugin_namespace)
    kind_steps = build_plan("kind", kind, objects=objects)
    cluster = options(node_access="direct", namespace=kind.plugin_namespace)
    cluster_steps = build_plan("cluster", cluster, objects=objects)
    own = ("cluster-check", "metadata-snapshot", "metadata-startup", "metadata-final")
    shared = [_shape(s) for s in cluster_steps if s.id not in own]
    assert [_shape(s) for s in kind_steps if _shape(s) in shared] == shared
    assert [s.id for s in kind_steps if _shape(s) not in shared] == [
        "metadata-snapshot", "kind-existing" if kind.existing_cluster else "kind-create",
        "metadata-startup", "kind-load", "kind-keep", "metadata-final",
    ]  # fmt: skip


def test_aks_shares_the_deploy_and_diagnostic_pod_steps() -> None:
    aks = options(target="aks")
    objects = recorded_objects(aks.plugin_namespace)
    aks_steps = {s.id: s for s in build_plan("aks", aks, objects=objects)}
    cluster = {s.id: s for s in build_plan("cluster", options(), objects=objects)}
    same = ("namespaces", "apply", "rollout", "baseline", "workloads", "delete-plugin",
            "delete-objects", "verify-objects", "diag-delete", "verify-diag-gone")  # fmt: skip
    for step_id in same:
        assert _shape(aks_steps[step_id]) == _shape(cluster[step_id]), step_id


def test_direct_access_names_a_node_whose_kubelet_is_not_here() -> None:
    assert local_kubelet("no-such-node-here") is None
    with pytest.raises(NodeAccessError, match="no kubelet for node no-such-node-here"):
        DirectAccess("no-such-node-here").run(["true"])
