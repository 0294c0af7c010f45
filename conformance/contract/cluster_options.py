"""The options of a run on a cluster target (kind, AKS, an existing cluster), defined once.

They live in the contract because the run context carries them from the CLI to the cluster
family typed; the cluster family (targets/cluster) is their only reader besides the CLI. What
holds for every cluster is checked here (`validate`); what one target requires (AKS's resource
group, an existing cluster's kubeconfig and nodes, kind's one hypervisor) is that target's own
rule, applied with these by the registry (hvconform.targets.cluster_options): nothing here
names a target.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar

from hvconform.contract import imageref
from hvconform.contract.datafiles import data_root

HYPERVISORS = ("kvm", "mshv")
# Which part of a run over several nodes of a pool this process does: "" the whole run (one
# node, or a single-node cluster); "cluster" the controller's part (deploy once for all, delete
# once); "node" one node's own checks beside the others' (hvconform.cluster_nodes).
SCOPES = ("", "cluster", "node")
# --deployed NAMESPACE/DAEMONSET: a namespace name and an object name, as the API accepts them
DEPLOYED = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?")
# "pod": a diagnostic pod + nsenter (as on AKS); "direct": the node runs on this machine;
# "host-pid": the suite itself runs in a privileged hostPID pod on the node it judges
NODE_ACCESS = ("pod", "direct", "host-pid")
NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
# The repository's layout of the suite's data (kind/cluster.yaml): the checkout, or the wheel's copy.
REPO_ROOT = data_root()
# A node image kind can pull from a registry; `nox -s kind-image` builds an offline one.
KIND_PUBLIC_NODE_IMAGE = "kindest/node:v1.31.0"


@dataclass(frozen=True)
class ClusterOptions:
    """Everything a cluster run needs, defined once; the run context carries it typed."""

    FAMILY: ClassVar[str] = "cluster"
    target: str = "kind"
    image: str = "hv-device-plugin:0.1.0"
    guest_image: str = ""  # workload pods; default: the plugin image (it ships the guest)
    namespace: str = ""  # plugin namespace (--namespace); else the target's, else one per run
    default_namespace: str = ""  # the target's own (its Target.plugin_namespace), set with it
    hypervisor: str = "kvm"
    run_id: str = "run"
    workdir: str = "/tmp/hvconform-cluster"  # kubeconfigs and the cluster report live here
    contract: bool = False  # True only under recorded stand-ins: never a live result
    # kind
    cluster_name: str = "hvconform"
    keep_cluster: bool = False
    existing_cluster: bool = False  # a cluster made by the caller (CI): used, never deleted
    kind_config: str = str(REPO_ROOT / "kind" / "cluster.yaml")
    node_image: str = KIND_PUBLIC_NODE_IMAGE
    # cluster (an existing cluster: never created nor deleted, only what the run puts there)
    kubeconfig: str = ""
    context: str = ""
    nodes: tuple[str, ...] = ()  # the nodes to certify; empty with all_nodes: every KVM node
    all_nodes: bool = False
    node_access: str = "pod"  # "pod": diagnostic pod + nsenter (as on AKS); "direct": here
    # node-reboot removes every pod sandbox of the node: on a cluster the run did not create,
    # only when the user opts in (--allow-node-reboot); kind's and AKS's own nodes always
    allow_node_reboot: bool = False
    # the full catalogue from the node's own pod (--node-access host-pid) on a node that is not
    # cordoned: refused unless the operator opts in (the node's workloads would see the faults)
    allow_disruption: bool = False
    # Which of the profile's per-target values (or manifests) to render: its own key for a
    # cluster of another kind (openshift, k3s, ...); empty: the target's (-mshv for MSHV).
    values_for: str = ""
    # values files of the user's on top of the profile's (a chart profile only), in order
    values_files: tuple[str, ...] = ()
    # profile objects wider than a plugin's deploy that the user named (--allow-object KIND/NAME)
    allow_objects: tuple[str, ...] = ()
    # aks
    resource_group: str = ""
    cluster: str = ""
    vm_size: str = "Standard_D4ads_v5"
    diag_image: str = "docker.io/library/busybox:1.36"
    # deadlines (seconds) and polling
    rollout_timeout: float = 300.0
    pod_timeout: float = 180.0
    delete_timeout: float = 300.0
    poll_interval: float = 1.0
    scope: str = ""  # one of SCOPES
    # the run's --mode (a common run flag: RunContext.mode holds it too), which the cluster
    # node obeys: "validate" sets the node up without writing anything of the plugin's
    mode: str = "full"
    # a plugin already deployed ("NAMESPACE/DAEMONSET"): judged as it runs, never applied,
    # restarted nor deleted (validate mode only)
    deployed: str = ""

    @property
    def plugin_namespace(self) -> str:
        # Per run unless the user or the target names one: deleting it can never remove
        # someone else's install.
        return self.namespace or self.default_namespace or f"hvconform-{self.short_id}"

    @property
    def work_namespace(self) -> str:
        return f"hvconform-work-{self.short_id}"

    @property
    def short_id(self) -> str:
        return (re.sub(r"[^a-z0-9]", "", self.run_id.lower()) or "run")[-8:]

    @property
    def run_label(self) -> str:
        """The run's label value on every object it creates (a label value: 63 characters of
        [-A-Za-z0-9_.], alphanumeric at both ends); `hvconform cleanup --run-id` takes it."""
        value = re.sub(r"[^A-Za-z0-9_.-]", "-", self.run_id)[-63:]
        return value.strip("-_.") or "run"

    @property
    def per_node(self) -> bool:
        """One node's own part of a pool run: named per node, deploys and deletes nothing."""
        return self.scope == "node"

    @property
    def device(self) -> str:
        return f"/dev/{self.hypervisor}"

    def validate(self) -> ClusterOptions:
        """Refuse what would make a run on any cluster unsafe or ambiguous; return self."""
        if self.hypervisor not in HYPERVISORS:
            raise ValueError(f"--hypervisor must be kvm or mshv, got {self.hypervisor!r}")
        # kind load and IfNotPresent need a fixed tag; :latest would be pulled, not loaded. The
        # guest image travels the same way; the node and diagnostic images are only pulled.
        for flag, image, pinned in (
            ("--image", self.image, True),
            ("--guest-image", self.guest_image, True),
            ("--node-image", self.node_image, False),
            ("--diag-image", self.diag_image, False),
        ):
            problem = imageref.problem(image, pinned=pinned) if image or flag == "--image" else None
            if problem:
                raise ValueError(f"{flag} {problem}")
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, got {self.scope!r}")
        if self.node_access not in NODE_ACCESS:
            raise ValueError(
                f"--node-access must be one of {', '.join(NODE_ACCESS)}, got {self.node_access!r}"
            )
        if self.deployed and self.mode != "validate":
            raise ValueError(
                "--deployed judges a serving plugin: only with --mode validate (a full run "
                "restarts and faults the plugin it deploys itself)"
            )
        if self.deployed and not DEPLOYED.fullmatch(self.deployed):
            raise ValueError(f"--deployed {self.deployed!r}: want NAMESPACE/DAEMONSET")
        return self

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterOptions:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for key in ("nodes", "allow_objects", "values_files"):
            if key in known:
                known[key] = tuple(known[key])
        return cls(**known)

    def with_(self, **changes: Any) -> ClusterOptions:
        return replace(self, **changes)
