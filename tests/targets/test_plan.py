"""Dry-run plans: golden text (fixtures/plans/), nothing executed, cleanup order = arming order.

Regenerate the goldens after an intended change with HV_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract import runcontext
from hvconform.contract.plugin import resolve as resolve_plugin
from hvconform.contract.runcontext import RunContext
from hvconform.targets import build_plan, cluster_options
from hvconform.targets.cluster.plan import ClusterOptions, render_plan
from hvconform.targets.cluster.run import values_key
from tests.targets.conftest import RUN_ID, recorded_objects

PLANS = Path(__file__).resolve().parents[2] / "fixtures" / "plans"
CASES: dict[str, dict[str, Any]] = {
    "kind": {"target": "kind"},
    "kind-keep-cluster": {"target": "kind", "keep_cluster": True, "cluster_name": "hv-dev"},
    "aks-kvm": {"target": "aks"},
    "aks-mshv": {"target": "aks", "hypervisor": "mshv"},
    "cluster-pod": {"target": "cluster", "nodes": ("hv-node",)},
    "cluster-direct": {"target": "cluster", "nodes": ("hv-node",), "node_access": "direct"},
}
# The existing-cluster target reads the caller's kubeconfig (it must exist; the plan names it).
KUBECONFIG = PLANS / "kubeconfig.yaml"


def golden_options(**kw: Any) -> ClusterOptions:
    """As the CLI hands them to the target: resolved by the registry (its traits filled)."""
    options = ClusterOptions(
        image="hv-device-plugin:0.1.0",
        run_id=RUN_ID,
        workdir="/tmp/hvconform-plan",
        kind_config="kind/cluster.yaml",
        resource_group="rg-hyperlight",
        cluster="aks-hyperlight",
        kubeconfig=str(KUBECONFIG),
        **kw,
    )
    return cluster_options(options.target, options)


@pytest.mark.parametrize("case", list(CASES))
def test_dry_run_plan_matches_golden(case: str) -> None:
    options = golden_options(**CASES[case])
    objects = recorded_objects(options.plugin_namespace, options.hypervisor)
    text = render_plan(build_plan(options.target, options, objects=objects), f"golden plan: {case}")
    golden = PLANS / f"{case}.txt"
    if os.environ.get("HV_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text(), f"plan changed; review and regenerate {golden.name}"


@pytest.mark.parametrize("case", list(CASES))
def test_cleanup_prints_in_the_order_it_runs(case: str) -> None:
    options = golden_options(**CASES[case])
    steps = build_plan(options.target, options, objects=recorded_objects(options.plugin_namespace))
    armed = [s.arms for s in steps if s.phase == "setup" and s.arms]
    assert [s.id for s in steps if s.phase == "cleanup"] == list(reversed(armed))


def test_building_a_plan_touches_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-executables-here"))
    options = golden_options(target="aks").with_(workdir=str(tmp_path / "work"))
    build_plan("aks", options, objects=recorded_objects(options.plugin_namespace))
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"image": "hv-device-plugin:latest"}, "explicit tag"),
        ({"image": "hv-device-plugin"}, "explicit tag"),
        ({"target": "aks", "resource_group": ""}, "--resource-group and --cluster"),
        ({"target": "kind", "hypervisor": "mshv"}, "kind target's nodes offer /dev/kvm only"),
        ({"hypervisor": "xen"}, "kvm or mshv"),
    ],
)
def test_unsafe_options_are_refused(change: dict[str, Any], message: str) -> None:
    options = golden_options(target="kind").with_(**change)
    with pytest.raises(ValueError, match=message):
        cluster_options(options.target, options)  # every cluster's rules, then the target's


def test_options_travel_typed_in_the_run_context(tmp_path: Path) -> None:
    options = golden_options(target="aks", hypervisor="mshv", keep_cluster=True)
    ctx = RunContext("r", str(tmp_path), "aks", resolve_plugin(), options=options)
    back = runcontext.read(ctx.write())
    assert back == ctx and back.cluster == options
    assert values_key(options) == "aks-mshv" and options.plugin_namespace == "hvconform-c0ffee01"


def test_plan_with_the_real_manifests_renderer() -> None:
    pytest.importorskip("hvconform.manifests", reason="hvconform.manifests not there yet")
    for target, kw in (("kind", {}), ("aks", {}), ("aks", {"hypervisor": "mshv"})):
        options = golden_options(target=target, **kw)
        steps = build_plan(target, options)
        assert any(s.id == "apply" and "DaemonSet" in s.manifest for s in steps)
