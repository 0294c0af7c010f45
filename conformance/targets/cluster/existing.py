"""The existing-cluster target: `hvconform run --target cluster --kubeconfig FILE --node NAME`.

The cluster is the caller's: it is never created nor deleted. The run puts there only its own
namespaces, the plugin's two DaemonSets (the manifests exactly as `hvconform manifests` prints
them: the text applied is kept as manifests.yaml in the run's cluster dir), its workload pods,
the diagnostic pod (`--node-access pod`, as on AKS) and a state directory on the node; cleanup
removes all of it and verifies each is gone. Node access: `pod` (privileged hostPID pod,
`nsenter -t 1`) or `direct` (the node runs on this machine). kind and AKS are this target plus
their own create and delete steps (`cluster_steps`).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Protocol

import yaml

from hv_device_plugin.api.names import HYPERVISOR_RESOURCE
from hvconform.contract.results import EnvironmentBlocked
from hvconform.targets.cluster.access import (
    STATE_DIR,
    DirectAccess,
    HostPidAccess,
    NodeAccess,
    local_kubelet,
    pod_exec_text,
)
from hvconform.targets.cluster.deploy import manifest_yaml
from hvconform.targets.cluster.diag import DIAG_NAME, DiagPods, diag_namespace, diag_steps
from hvconform.targets.cluster.kube import KubeApi, Obj
from hvconform.targets.cluster.lifecycle import Action
from hvconform.targets.cluster.plan import ClusterOptions, Step
from hvconform.targets.cluster.run import (
    RESTORE,
    STATE_MARK,
    ClusterLifecycle,
)
from hvconform.targets.cluster.workloads import Layout, diagnostic_pod, prepare

MANIFESTS_FILE = "manifests.yaml"  # the exact text applied, next to the cluster report
# gone, or there and never the run's (no mark: node-prepare refused it and left it as it was)
STATE_GONE = (
    f"if [ ! -e {STATE_DIR} ] && [ ! -L {STATE_DIR} ]; then echo gone; "
    f'elif [ -L {STATE_DIR} ] || [ ! -f {STATE_MARK} ]; then echo "not the run\'s: left"; '
    "else echo present; fi"
)


class MetadataCheck(Protocol):
    """hvconform.metadata.twophase.TwoPhase, as this module uses it."""

    def snapshot_original(self) -> object: ...
    def check_startup(self, node_kvm_gid: int | str | None = None) -> object: ...
    def check_final(self) -> object: ...
    def skip(self, why: str) -> None: ...
    def summary(self) -> dict[str, Any]: ...


def default_metadata(device: str) -> MetadataCheck | None:
    """The two-phase helper (hvconform.metadata.twophase); None when it cannot be imported."""
    try:
        module = importlib.import_module("hvconform.metadata.twophase")
    except ImportError:
        return None
    check: MetadataCheck = module.TwoPhase(device)
    return check


def failed_verdict(verdict: object) -> bool:
    """A Verdict other than accepted (rejected, or an error such as a failed group lookup)."""
    return getattr(verdict, "status", "accepted") != "accepted"


def verdict_message(verdict: object) -> str:
    return str(getattr(verdict, "message", verdict))


def parse(text: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(text) if isinstance(doc, dict)]


# What one run does once for all its nodes (`scope` "cluster"); each node's part is the rest.
CLUSTER_LEVEL = frozenset(
    {
        "namespaces",
        "dry-run",
        "apply",
        "rollout",
        "delete-plugin",
        "delete-objects",
        "verify-objects",
    }
)


def cluster_steps(
    shared: dict[str, Step], diag: dict[str, Step] | None, *, verify_objects: bool = True
) -> list[Step]:
    """The existing-cluster target's steps in order; kind puts its own around them (and when
    it deletes the cluster, nothing is left to ask for the objects)."""
    pod = list(diag.values())[:1] if diag else []
    return [
        shared["namespaces"],
        shared["dry-run"],
        *pod,
        shared["node-check"],
        shared["node-prepare"],
        shared["apply"],
        shared["rollout"],
        shared["baseline"],
        shared["workloads"],
        shared["delete-plugin"],
        shared["node-restore"],
        *([diag["diag-delete"]] if diag else []),
        shared["delete-objects"],
        *([shared["verify-objects"]] if verify_objects else []),
        *([diag["verify-diag-gone"]] if diag else []),
    ]


class ExistingLifecycle(ClusterLifecycle):
    name = "cluster"

    def __init__(
        self,
        options: ClusterOptions,
        objects: list[Obj] | None = None,
        *,
        metadata: MetadataCheck | None = None,
        **kw: Any,
    ) -> None:
        self.metadata = metadata
        node_name = options.nodes[0] if options.nodes else ""
        if "api_factory" not in kw:
            kw["api_factory"] = lambda path: KubeApi(path, context=options.context)
        super().__init__(options, objects, **kw)
        # the exact objects the profile rendered, kept next to the cluster report
        self.text = manifest_yaml(self.rendered) + "\n" if objects is None else ""
        self.kubeconfig = options.kubeconfig  # the caller's: read, never written nor removed
        self.node_name = node_name
        self.diag = DiagPods(self.api, options, self.report)
        self._access: NodeAccess | None = None

    # -- hooks ----------------------------------------------------------------------------

    def prepare(self, rendered: list[Obj]) -> tuple[list[Obj], Layout]:
        return prepare(rendered, isolate_host_view=False, pods=self.pods, paths=self.plugin.paths)

    def extra_namespaces(self) -> list[Obj]:
        return [diag_namespace(self.options)] if self.options.node_access == "pod" else []

    def extra_dry_run(self) -> list[Obj]:
        """The diagnostic pod too: a cluster that refuses privileged pods is environment_blocked
        before anything runs on a node."""
        if self.options.node_access != "pod":
            return []
        o = self.options
        return [diagnostic_pod(DIAG_NAME, self.diag.namespace, self.node_name, o.diag_image)]

    def access(self) -> NodeAccess:
        if self._access is None:
            if self.options.node_access == "pod":
                raise RuntimeError("node access through the diagnostic pod before it exists")
            self._access = (
                HostPidAccess(self.node_name, self.runner)
                if self.options.node_access == "host-pid"
                else DirectAccess(self.node_name, self.runner)
            )
        return self._access

    def node_cmd(self, argv: list[str]) -> str:
        if self.options.node_access == "pod":
            return pod_exec_text(self.diag.name(self.node_name), argv)
        if self.options.node_access == "host-pid":
            return HostPidAccess(self.node_name or "<node>").wrap(argv)
        return DirectAccess(self.node_name or "<node>").wrap(argv)

    def steps(self) -> list[Step]:
        o = self.options
        where = self.node_name or "the node"
        diag = diag_steps(o, where, f"node {where}") if o.node_access == "pod" else None
        check = Step(
            "cluster-check",
            "setup",
            f"the caller's cluster ({Path(o.kubeconfig).name}"
            f"{', context ' + o.context if o.context else ''}):"
            f" server version, node {where} Ready (never created, never deleted)",
            api=("GET /version", f"GET /api/v1/nodes/{where}"),
        )
        steps = [check, *cluster_steps(self.shared_steps(), diag)]
        if o.scope == "cluster":  # several nodes: the run's controller deploys once, for all
            return [s for s in steps if s.id in CLUSTER_LEVEL or s.id == "cluster-check"]
        if o.per_node:  # ... and each node's own run does the rest
            steps = [s for s in steps if s.id not in CLUSTER_LEVEL]
        dev = o.device
        # after the rollout (this run's, or the controller's before this node's part began)
        ids = [s.id for s in steps]
        after = ids.index("rollout") if "rollout" in ids else ids.index("node-prepare")
        steps.insert(
            after + 1,
            Step("metadata-startup", "setup", f"this machine's {dev}: unchanged (no udev here)"),
        )
        if o.allow_node_reboot and "baseline" in ids:
            steps.insert([s.id for s in steps].index("baseline") + 1, reboot_step(where))
        return [
            Step(
                "metadata-snapshot",
                "setup",
                f"this machine's {dev} metadata (phase 0), when the node runs on this machine",
            ),
            *steps,
            Step("metadata-final", "verify", f"this machine's {dev} metadata exactly as validated"),
        ]

    def actions(self) -> dict[str, Action]:
        return {
            **super().actions(),
            "cluster-check": lambda s: self._check_cluster(),
            "node-reboot-allowed": lambda s: self.report.notes.append(s.what),
            "diag-pod": lambda s: self._create_diag(),
            "diag-delete": lambda s: self.diag.delete(),
            "verify-diag-gone": lambda s: self.diag.verify(),
            "node-restore": lambda s: self._restore_node(),
            "metadata-snapshot": lambda s: self._metadata("snapshot"),
            "metadata-startup": lambda s: self._metadata("startup"),
            "metadata-final": lambda s: self._metadata("final"),
        }

    # -- actions --------------------------------------------------------------------------

    def _check_cluster(self) -> None:
        if self.text and not self.options.per_node:
            out = self.workdir / MANIFESTS_FILE
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(self.text)
        for name in self.options.nodes:
            node = self.api().get("v1", "Node", name)
            if node is None:
                raise EnvironmentBlocked(f"the cluster has no node {name!r}")
            conds = node.get("status", {}).get("conditions", [])
            if not any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                raise EnvironmentBlocked(f"node {name} is not Ready")
            self._may_disturb(name, node)
        self.report.environment["cluster_kubeconfig"] = self.options.kubeconfig
        self.report.environment["node_access"] = self.options.node_access

    def _may_disturb(self, name: str, node: Obj) -> None:
        """The full catalogue from the node's own pod faults a node that may serve workloads:
        only on one cordoned for conformance, or with --allow-disruption."""
        o = self.options
        if o.node_access != "host-pid" or o.mode != "full" or o.allow_disruption:
            return
        if not node.get("spec", {}).get("unschedulable"):
            raise EnvironmentBlocked(
                f"node {name} is not cordoned and the full catalogue injects faults there: "
                f"`kubectl cordon {name}` for conformance, or --mode validate, or "
                "--allow-disruption"
            )

    def _metadata(self, phase: str) -> None:
        """The two phases on this machine's device, when the node is this machine's (its
        kubelet runs here); a remote node's device is not here to check."""
        if self.options.node_access == "host-pid":
            if phase == "snapshot":
                why = (
                    "the suite runs in the node's own pod, whose /dev is not the node's: the "
                    "device's metadata is checked through node access (validate-metadata)"
                )
                self.report.notes.append(f"host metadata phases skipped: {why}")
                if self.metadata is not None:
                    self.metadata.skip(why)
            return
        if self.metadata is None or local_kubelet(self.node_name) is None:
            if phase == "snapshot":
                self.report.notes.append("host metadata phases skipped: node not on this machine")
                if self.metadata is not None:
                    self.metadata.skip(
                        f"node {self.node_name}'s {self.options.device} is not on the machine the "
                        "suite runs on (no kubelet of that node among its processes): run the "
                        "suite on the node, in the host's PID namespace with the device mounted, "
                        "to check it"
                    )
            return
        if phase == "snapshot":
            self.metadata.snapshot_original()
            return
        verdict = (
            self.metadata.check_startup(None) if phase == "startup" else self.metadata.check_final()
        )
        self.report.verify(f"host device metadata ({phase})", not failed_verdict(verdict),
                           verdict_message(verdict))  # fmt: skip
        if phase == "final":
            self.report.environment["metadata_two_phase"] = self.metadata.summary()
        elif failed_verdict(verdict):
            raise RuntimeError(f"host {self.options.device} at startup: {verdict_message(verdict)}")

    def _create_diag(self) -> None:
        self._access = self.diag.create(self.node_name)

    def _restore_node(self) -> None:
        self.node_sh(RESTORE)
        seen = self.access().run(["sh", "-c", STATE_GONE]).stdout.decode().strip()
        ok = seen in ("gone", "not the run's: left")
        self.report.verify("node state dir removed", ok, f"{STATE_DIR}: {seen}")


def reboot_step(node: str) -> Step:
    """What --allow-node-reboot lets the node-reboot check do, named in the plan."""
    return Step(
        "node-reboot-allowed",
        "setup",
        f"--allow-node-reboot: the node-reboot check stops the kubelet of node {node} and "
        "removes EVERY pod sandbox on it through CRI (crictl rmp), other people's workloads "
        "too, then starts the kubelet again",
    )


def kvm_nodes(api: KubeApi) -> list[str]:
    """Every node the KVM manifests select (the hypervisor label), for --all-nodes."""
    nodes = api.list_objects("v1", "Node", labels=f"{HYPERVISOR_RESOURCE}=kvm")
    return sorted(str(n["metadata"]["name"]) for n in nodes)
