"""The cluster targets' options (kind, an existing cluster, AKS): their flags and their one
typed object, hvconform.contract.cluster_options.ClusterOptions.

The flags every cluster target reads come first, then each target's own group. The registry adds
them to `hvconform run`, builds the object once from the parsed flags (`options`) and then
applies every cluster's rules and the chosen target's (hvconform.targets.cluster_options).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from hv_device_plugin.api.names import default_guest_image
from hvconform.contract.args import image_arg, values_file_arg, values_key_arg
from hvconform.contract.cluster_options import HYPERVISORS, NODE_ACCESS, ClusterOptions
from hvconform.targets import GroupFor, OptionInputs


def add_options(group_for: GroupFor, env: Mapping[str, str]) -> None:
    _shared(group_for("kind", "cluster", "aks"), env)
    _kind(group_for("kind"), env)
    _existing(group_for("cluster"))
    _aks(group_for("aks"))


def options(ns: argparse.Namespace, inputs: OptionInputs) -> ClusterOptions:
    """The run's ClusterOptions from its flags (the image: --image, else the profile's)."""
    return ClusterOptions(
        target=ns.target,
        image=ns.image or inputs.plugin.image or "",
        guest_image=ns.guest_image,
        hypervisor=ns.hypervisor,
        run_id=inputs.run_id,
        workdir=str(inputs.out / "cluster"),
        cluster_name=ns.cluster_name,
        node_image=ns.node_image,
        kind_config=ns.kind_config,
        keep_cluster=ns.keep_cluster,
        existing_cluster=ns.existing_cluster,
        resource_group=ns.resource_group,
        cluster=ns.cluster,
        vm_size=ns.vm_size,
        kubeconfig=str(Path(ns.kubeconfig).resolve()) if ns.kubeconfig else "",
        context=ns.context,
        nodes=tuple(ns.nodes),
        all_nodes=ns.all_nodes,
        node_access=ns.node_access,
        deployed=ns.deployed,
        mode=ns.mode,  # the run's common --mode, which the cluster node's setup obeys
        allow_node_reboot=ns.allow_node_reboot,
        allow_disruption=ns.allow_disruption,
        allow_objects=tuple(ns.allow_objects),
        values_for=ns.values_for,
        values_files=tuple(ns.values_files),
        **({"diag_image": ns.diag_image} if ns.diag_image else {}),
    )


def _shared(group: argparse._ArgumentGroup, env: Mapping[str, str]) -> None:
    group.add_argument(
        "--guest-image",
        default=env.get("HV_GUEST_IMAGE") or default_guest_image(),
        type=image_arg(pinned=True, env="HV_GUEST_IMAGE", environ=env),
        help="the suite's workload image (python -m hvconform.guest; `nox -s image` builds "
        "it), never the plugin's; a fixed tag or a digest [HV_GUEST_IMAGE]",
    )
    group.add_argument(
        "--hypervisor",
        choices=HYPERVISORS,
        default="kvm",
        help="which device the nodes offer (an AKS pool's kind); KVM and MSHV are never mixed "
        "in one run",
    )
    group.add_argument(
        "--values-for",
        default="",
        metavar="KEY",
        type=values_key_arg,
        help="render the plugin with this key of its profile's per-target values (or "
        "manifests) instead of the target's own: a key of the profile's for a cluster of "
        "another kind (openshift, k3s, ...), so any conformant cluster is certified with "
        "--target cluster and its own values, no new target",
    )
    group.add_argument(
        "--values",
        dest="values_files",
        action="append",
        default=[],
        metavar="FILE",
        type=values_file_arg,
        help="a Helm values file of yours, on top of the profile's (a chart profile only; "
        "repeatable, later wins); read once, strictly, before anything runs",
    )
    group.add_argument(
        "--allow-object",
        dest="allow_objects",
        action="append",
        default=[],
        metavar="KIND/NAME",
        help="apply this object of the profile although it is wider than a plugin's deploy (a "
        "binding to a built-in role or to users or groups, a webhook, a CRD, an APIService, "
        "another cluster-scoped kind, hostPID/hostNetwork/hostIPC pods, a hostPath of the "
        "host's root or system trees); NAME as the profile writes it (or its generateName). "
        "Repeatable; each is printed in the plan and the report, and one that names nothing "
        "needing it is refused",
    )
    group.add_argument(
        "--diag-image",
        default="",
        type=image_arg(pinned=False),
        help="cluster/aks: the diagnostic pod's image (needs nsenter)",
    )


def _kind(group: argparse._ArgumentGroup, env: Mapping[str, str]) -> None:
    group.add_argument("--cluster-name", default="hvconform", help="the kind cluster's name")
    group.add_argument(
        "--node-image",
        default=env.get("HV_KIND_NODE_IMAGE") or ClusterOptions.node_image,
        type=image_arg(pinned=False, env="HV_KIND_NODE_IMAGE", environ=env),
        help="the node image (`nox -s kind-image` builds one offline, hv-kind.local/node:TAG, "
        "and the kind engine names it when it holds it) [HV_KIND_NODE_IMAGE]",
    )
    group.add_argument("--kind-config", default=ClusterOptions.kind_config, help="kind's config")
    group.add_argument(
        "--keep-cluster",
        action="store_true",
        help="keep the cluster (the plugin's objects are still deleted)",
    )
    group.add_argument(
        "--existing-cluster",
        action="store_true",
        help="use the cluster --cluster-name made by the caller; never delete it",
    )


def _existing(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--kubeconfig", default="", help="the existing cluster's kubeconfig")
    group.add_argument("--context", default="", help="kubeconfig context (default: current)")
    group.add_argument(
        "--node", action="append", default=[], dest="nodes", help="a node to certify"
    )
    group.add_argument("--all-nodes", action="store_true", help="every KVM-labelled node")
    group.add_argument(
        "--node-access",
        choices=NODE_ACCESS,
        default="pod",
        help="through a privileged diagnostic pod (as on AKS), directly (the node runs on "
        "this machine), or host-pid (the suite itself runs in a privileged hostPID pod on the "
        "node it judges: `hvconform sonobuoy-plugin` declares that pod)",
    )
    group.add_argument(
        "--allow-disruption",
        action="store_true",
        help="with --node-access host-pid and --mode full: run the fault checks on a node that "
        "is not cordoned (its workloads see every fault); without it such a node is refused",
    )
    group.add_argument(
        "--deployed",
        default="",
        metavar="NAMESPACE/DAEMONSET",
        help="with --mode validate: judge the plugin this DaemonSet already runs on the node "
        "(read, never applied, restarted nor deleted) instead of deploying the profile's",
    )
    group.add_argument(
        "--allow-node-reboot",
        action="store_true",
        help="let the node-reboot check reboot the nodes named (it stops their kubelet and "
        "removes EVERY pod sandbox there, other workloads too); without it node-reboot is "
        "not_applicable there. kind and aks nodes the run creates are always rebooted",
    )


def _aks(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--resource-group", default="", help="resource group (required)")
    group.add_argument("--cluster", default="", help="existing cluster (required)")
    group.add_argument("--vm-size", default="Standard_D4ads_v5", help="the pool's VM size")
