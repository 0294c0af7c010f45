"""Each cluster target owns its option rules (issue 37 item 1): the registry applies every
cluster's rules (ClusterOptions.validate) and then the chosen target's own (its hypervisors, its
family module's check_options), and fills the target's traits (its plugin namespace). Nothing
outside conformance/targets names a target to do so (tests/conformance/test_target_names.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hvconform.contract.cluster_options import ClusterOptions
from hvconform.targets import TARGETS, cluster_options


def test_kind_offers_kvm_only_and_says_which_flag() -> None:
    with pytest.raises(
        ValueError, match=r"kind target's nodes offer /dev/kvm only: --hypervisor kvm"
    ):
        cluster_options("kind", ClusterOptions(hypervisor="mshv"))
    assert cluster_options(
        "aks", ClusterOptions(hypervisor="mshv", resource_group="g", cluster="c")
    )


def test_aks_needs_its_cluster_named() -> None:
    with pytest.raises(ValueError, match="--resource-group and --cluster"):
        cluster_options("aks", ClusterOptions(resource_group="g"))


def test_an_existing_cluster_needs_a_kubeconfig_and_nodes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--kubeconfig FILE"):
        cluster_options("cluster", ClusterOptions(nodes=("n1",)))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\n")
    with pytest.raises(ValueError, match="--node NAME"):
        cluster_options("cluster", ClusterOptions(kubeconfig=str(kubeconfig)))
    with pytest.raises(ValueError, match="not a Kubernetes node name"):
        cluster_options("cluster", ClusterOptions(kubeconfig=str(kubeconfig), nodes=("N_1",)))
    ok = cluster_options("cluster", ClusterOptions(kubeconfig=str(kubeconfig), nodes=("n1",)))
    assert ok.target == "cluster"


def test_the_plugin_namespace_is_the_targets_or_one_per_run() -> None:
    kind = cluster_options("kind", ClusterOptions(run_id="c0ffee01"))
    assert kind.plugin_namespace == TARGETS["kind"].plugin_namespace == "hyperlight-system"
    aks = cluster_options("aks", ClusterOptions(run_id="c0ffee01", resource_group="g", cluster="c"))
    assert aks.plugin_namespace == "hvconform-c0ffee01"  # deleting it removes only this run's
    mine = cluster_options("kind", ClusterOptions(namespace="mine"))
    assert mine.plugin_namespace == "mine"


def test_a_target_without_a_plan_has_no_cluster_options() -> None:
    with pytest.raises(ValueError, match="has no plan"):
        cluster_options("local", ClusterOptions())
