"""The AKS target: a temporary, tainted user node pool in an existing cluster.

Everything through the `az` executable and the API with a temporary kubeconfig. Before anything
costly, a server-side dry run (dryRun=All) of every object: AKS Automatic's Deployment Safeguards
refuse hostPath volumes and privileged pods, and that is environment_blocked, not a plugin
failure. Node access is a privileged diagnostic pod (hostPID, nsenter), created and removed by the
harness. Cleanup always runs and is verified: pool gone, namespaces gone, diagnostic pod gone,
original node labels and pre-existing pod UIDs and restart counts unchanged.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hvconform.contract.plugin import PluginUnderTest
from hvconform.contract.runcontext import RunContext
from hvconform.contract.wait import wait_for
from hvconform.targets.cluster.access import (
    CommandFailed,
    NodeAccess,
    PodExecAccess,
    pod_exec_text,
)
from hvconform.targets.cluster.diag import DIAG_NAME, DiagPods, diag_namespace, diag_steps
from hvconform.targets.cluster.kube import Obj
from hvconform.targets.cluster.lifecycle import Action
from hvconform.targets.cluster.node import ClusterNode
from hvconform.targets.cluster.plan import ClusterOptions, Step
from hvconform.targets.cluster.run import ClusterLifecycle, cluster_options, open_cluster, plan_of
from hvconform.targets.cluster.workloads import (
    RUN_LABEL,
    TAINT_KEY,
    Layout,
    diagnostic_pod,
    prepare,
    workload_pod,
)

DRY_RUN_NODE = "hvconform-dry-run"  # nodeName of the pods sent only as a dry run


class AksLifecycle(ClusterLifecycle):
    name = "aks"
    taint = True

    def __init__(
        self, options: ClusterOptions, objects: list[Obj] | None = None, **kw: Any
    ) -> None:
        self.pool = f"hv{options.hypervisor[0]}{options.short_id}"[:12]
        super().__init__(options, objects, **kw)
        self.diag = DiagPods(self.api, options, self.report)
        self.diag_ns, self.diag_name = self.diag.namespace, DIAG_NAME
        self.before: dict[str, Any] = {}
        self._pod_access: PodExecAccess | None = None

    # -- hooks ----------------------------------------------------------------------------

    def prepare(self, rendered: list[Obj]) -> tuple[list[Obj], Layout]:
        return prepare(
            rendered,
            pin_labels={RUN_LABEL: self.options.short_id},
            taint=True,
            pods=self.pods,
            paths=self.plugin.paths,
        )

    def extra_namespaces(self) -> list[Obj]:
        return [diag_namespace(self.options)]

    def extra_dry_run(self) -> list[Obj]:
        o = self.options
        return [
            diagnostic_pod(self.diag_name, self.diag_ns, DRY_RUN_NODE, o.diag_image),
            workload_pod(
                "hvconform-guest-dry-run",
                o.work_namespace,
                DRY_RUN_NODE,
                o.guest_image or o.image,
                o.device,
                taint=True,
                guest=o.hypervisor == "kvm",
            ),
        ]

    def access(self) -> NodeAccess:
        if self._pod_access is None:
            self._pod_access = PodExecAccess(self.api(), self.diag_ns, self.diag_name)
        return self._pod_access

    def node_cmd(self, argv: list[str]) -> str:
        return pod_exec_text(self.diag_name, argv)

    # -- the plan -------------------------------------------------------------------------

    def _az(self, *args: str) -> tuple[str, ...]:
        o = self.options
        return ("az", "aks", *args, "--resource-group", o.resource_group)

    def steps(self) -> list[Step]:
        o = self.options
        shared = self.shared_steps()
        mshv = o.hypervisor == "mshv"
        runtime = (
            ("--os-sku", "AzureLinux", "--workload-runtime", "KataVmIsolation")
            if mshv
            else ("--os-sku", "Ubuntu")
        )
        labels = (
            "hyperlight.dev/enabled=true",
            f"hyperlight.dev/hypervisor={o.hypervisor}",
            f"{RUN_LABEL}={o.short_id}",
        )
        add = (
            *self._az("nodepool", "add"), "--cluster-name", o.cluster, "--name", self.pool,
            "--mode", "User", "--node-count", "1", "--node-vm-size", o.vm_size, *runtime,
            "--node-taints", f"{TAINT_KEY}={o.short_id}:NoSchedule", "--labels", *labels,
            "--tags", f"hvconform-run={o.short_id}", "--output", "json",
        )  # fmt: skip
        pool = ("--cluster-name", o.cluster, "--name", self.pool)
        diag = diag_steps(o, "<pool node>", "the pool node")
        return [
            Step(
                "az-account",
                "setup",
                "the az login in use",
                argv=("az", "account", "show", "--output", "json"),
            ),
            Step(
                "credentials",
                "setup",
                "credentials into a temporary kubeconfig (never ~/.kube/config)",
                argv=(
                    *self._az("get-credentials"),
                    "--name",
                    o.cluster,
                    "--file",
                    self.kubeconfig,
                    "--overwrite-existing",
                ),
            ),
            Step(
                "snapshot",
                "setup",
                "record node labels, pod UIDs and restart counts before anything changes",
                api=("GET /api/v1/nodes", "GET /api/v1/pods"),
            ),
            shared["namespaces"],
            shared["dry-run"],
            Step(
                "nodepool-add",
                "setup",
                f"temporary tainted user pool {self.pool} ({o.hypervisor})",
                argv=add,
                arms="nodepool-delete",
            ),
            Step(
                "node-wait",
                "setup",
                "the pool's node Ready",
                api=(f"GET /api/v1/nodes?labelSelector=agentpool={self.pool}",),
            ),
            diag["diag-pod"],
            shared["node-check"],
            shared["node-prepare"],
            shared["apply"],
            shared["rollout"],
            shared["baseline"],
            shared["workloads"],
            shared["delete-plugin"],
            shared["node-restore"],
            diag["diag-delete"],
            Step(
                "nodepool-delete",
                "cleanup",
                f"delete pool {self.pool} (waits for completion)",
                argv=(*self._az("nodepool", "delete"), *pool, "--output", "none"),
            ),
            shared["delete-objects"],
            Step(
                "verify-pool-gone",
                "verify",
                f"pool {self.pool} no longer listed",
                argv=(
                    *self._az("nodepool", "list"),
                    "--cluster-name",
                    o.cluster,
                    "--query",
                    "[].name",
                    "--output",
                    "json",
                ),
            ),
            shared["verify-objects"],
            diag["verify-diag-gone"],
            Step(
                "verify-cluster",
                "verify",
                "original node labels, pre-existing pod UIDs and restart counts unchanged",
                api=("GET /api/v1/nodes", "GET /api/v1/pods"),
            ),
            Step("credentials-remove", "verify", f"remove {self.kubeconfig}"),
        ]

    # -- actions --------------------------------------------------------------------------

    def actions(self) -> dict[str, Action]:
        return {
            **super().actions(),
            "az-account": self._account,
            "snapshot": lambda s: self.before.update(self._cluster_state()),
            "node-wait": lambda s: self._wait_node(),
            "diag-pod": lambda s: self._create_diag(),
            "diag-delete": lambda s: self.diag.delete(),
            "nodepool-delete": self._delete_pool,
            "verify-pool-gone": self._verify_pool,
            "verify-diag-gone": lambda s: self.diag.verify(),
            "verify-cluster": lambda s: self._verify_cluster(),
            "credentials-remove": lambda s: self._remove_credentials(),
        }

    def _account(self, step: Step) -> None:
        account = json.loads(self.runner.run(list(step.argv)).stdout or b"{}")
        self.report.environment["azure_subscription"] = account.get("name", "")
        self.report.environment["cluster"] = f"{self.options.resource_group}/{self.options.cluster}"

    def _cluster_state(self) -> dict[str, Any]:
        nodes = {
            n["metadata"]["name"]: n["metadata"].get("labels", {})
            for n in self.api().list_objects("v1", "Node")
        }
        pods = {
            p["metadata"]["uid"]: {
                "pod": f"{p['metadata']['namespace']}/{p['metadata']['name']}",
                "restarts": sorted(
                    (c["name"], int(c.get("restartCount", 0)))
                    for c in p.get("status", {}).get("containerStatuses", [])
                ),
            }
            for p in self.api().list_objects("v1", "Pod")
        }
        return {"nodes": nodes, "pods": pods}

    def _wait_node(self) -> None:
        def ready() -> str | None:
            for node in self.api().list_objects("v1", "Node", labels=f"agentpool={self.pool}"):
                conds = node.get("status", {}).get("conditions", [])
                if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                    return str(node["metadata"]["name"])
            return None

        self.node_name = wait_for(
            ready,
            self.options.rollout_timeout,
            f"a Ready node in pool {self.pool}",
            self.options.poll_interval,
        )
        self.report.environment["pool"] = self.pool

    def _create_diag(self) -> None:
        self._pod_access = self.diag.create(self.node_name)

    def _delete_pool(self, step: Step) -> None:
        try:
            self.runner.run(list(step.argv), timeout=3600)
        except CommandFailed as exc:
            if (
                "notfound" in exc.stderr.lower().replace(" ", "")
                or "not found" in exc.stderr.lower()
            ):
                self.report.notes.append(f"pool {self.pool} did not exist: nothing to delete")
                return
            raise

    def _verify_pool(self, step: Step) -> None:
        names = json.loads(self.runner.run(list(step.argv)).stdout or b"[]")
        self.report.verify("node pool deleted", self.pool not in names, f"pools now: {names}")

    def _verify_cluster(self) -> None:
        if not self.before:
            # The snapshot precedes every change: without one, this run changed nothing.
            self.report.verify("cluster state unchanged", True, "run stopped before the snapshot")
            return
        after = self._cluster_state()
        changed = [
            f"node {n}: labels changed" if n in after["nodes"] else f"node {n}: gone"
            for n, labels in self.before["nodes"].items()
            if after["nodes"].get(n) != labels
        ]
        self.report.verify(
            "original node labels unchanged",
            not changed,
            "; ".join(changed) or f"{len(self.before['nodes'])} nodes",
        )
        moved = [
            f"{p['pod']}: {'restarted' if uid in after['pods'] else 'gone'}"
            for uid, p in self.before["pods"].items()
            if after["pods"].get(uid, {}).get("restarts") != p["restarts"]
        ]
        self.report.verify(
            "pre-existing pods unchanged (UIDs, restart counts)",
            not moved,
            "; ".join(moved[:20]) or f"{len(self.before['pods'])} pods",
        )

    def _remove_credentials(self) -> None:
        Path(self.kubeconfig).unlink(missing_ok=True)
        self.report.verify(
            "temporary kubeconfig removed", not Path(self.kubeconfig).exists(), self.kubeconfig
        )


def check_options(options: ClusterOptions) -> None:
    """This target's own rule: the cluster it adds a node pool to, named (no defaults)."""
    if not (options.resource_group and options.cluster):
        raise ValueError("the aks target needs --resource-group and --cluster (no defaults)")


def build_plan(
    options: ClusterOptions,
    objects: list[Obj] | None = None,
    plugin: PluginUnderTest | None = None,
) -> list[Step]:
    """The AKS plan; builds the lifecycle without running anything."""
    return AksLifecycle(options, objects, plugin=plugin).steps()


def plan_text(options: ClusterOptions, plugin: PluginUnderTest | None = None) -> str:
    """What `--dry-run` prints for AKS."""
    where = f"AKS {options.resource_group}/{options.cluster}, {options.hypervisor}"
    return plan_of(
        AksLifecycle(options, None, plugin=plugin),
        f"hvconform plan: {where}, image {options.image}",
    )


@contextlib.contextmanager
def open_node(
    ctx: RunContext, *, worker: str, metadata: object | None = None
) -> Iterator[ClusterNode]:
    """The registry's entry: a temporary AKS node pool, its node, always deleted. The node's
    device is not on this machine, so there is no host metadata to check here."""
    options = cluster_options(ctx, "aks")
    out_dir = ctx.out
    with open_cluster(AksLifecycle(options, None, plugin=ctx.plugin), out_dir=out_dir) as node:
        yield node
