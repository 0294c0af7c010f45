"""The diagnostic pod: node access through the API server (AKS, and `--node-access pod` anywhere).

A privileged hostPID pod pinned to one node; `nsenter -t 1` from it is the node (PID 1 of the
node's PID namespace is the node's init). It lives in a namespace of its own (the pod security
level `privileged` there, nowhere else), is created after the node is known and deleted, then
verified gone, in cleanup. Shared by the AKS lifecycle and the existing-cluster target.
"""

from __future__ import annotations

from collections.abc import Callable

from hvconform.contract.wait import wait_for
from hvconform.targets.cluster.access import PodExecAccess
from hvconform.targets.cluster.deploy import manifest_yaml
from hvconform.targets.cluster.kube import KubeApi, Obj, resource_path
from hvconform.targets.cluster.lifecycle import RunReport
from hvconform.targets.cluster.plan import ClusterOptions, Step
from hvconform.targets.cluster.workloads import MANAGED, diagnostic_pod

DIAG_NAME = "hvconform-diag"


def diag_namespace_name(options: ClusterOptions) -> str:
    return f"hvconform-diag-{options.short_id}"


def diag_namespace(options: ClusterOptions) -> Obj:
    labels = {**MANAGED, "pod-security.kubernetes.io/enforce": "privileged"}
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": diag_namespace_name(options), "labels": labels},
    }


class DiagPods:
    """One diagnostic pod per node of the run: made, reached, deleted, verified gone."""

    def __init__(
        self, api: Callable[[], KubeApi], options: ClusterOptions, report: RunReport
    ) -> None:
        self.api = api
        self.options = options
        self.report = report
        self.namespace = diag_namespace_name(options)
        self.made: dict[str, str] = {}  # node -> pod name

    def name(self, node: str, index: int = 0) -> str:
        if self.options.per_node:  # one per node of a multi-node run
            return f"{DIAG_NAME}-{node}"
        return DIAG_NAME if index == 0 else f"{DIAG_NAME}-{index}"

    def path(self, pod: str = DIAG_NAME) -> str:
        return resource_path("v1", "Pod", self.namespace, pod)

    def create(self, node: str, index: int = 0) -> PodExecAccess:
        pod = self.name(node, index)
        self.made[node] = pod  # before the request: a timed-out create may still have landed
        self.api().create(diagnostic_pod(pod, self.namespace, node, self.options.diag_image))

        def running() -> bool:
            obj = self.api().get("v1", "Pod", pod, self.namespace) or {}
            return any(
                "running" in c.get("state", {})
                for c in obj.get("status", {}).get("containerStatuses", [])
            )

        wait_for(
            running,
            self.options.pod_timeout,
            f"diagnostic pod on {node} running",
            self.options.poll_interval,
        )
        return PodExecAccess(self.api(), self.namespace, pod)

    def delete(self) -> None:
        api = self.api()
        for pod in self.made.values():
            api.delete("v1", "Pod", pod, self.namespace, grace=0)
        for pod in self.made.values():
            if not api.wait_gone(
                "v1",
                "Pod",
                pod,
                self.namespace,
                self.options.delete_timeout,
                self.options.poll_interval,
            ):
                raise RuntimeError(f"diagnostic pod {self.namespace}/{pod} still present")

    def verify(self) -> None:
        if not self.made:
            self.report.verify("diagnostic pod gone", True, "never created")
            return
        left = [p for p in self.made.values() if self.api().get("v1", "Pod", p, self.namespace)]
        self.report.verify(
            "diagnostic pod gone",
            not left,
            f"{self.namespace}/{', '.join(self.made.values())}; left: {left or 'none'}",
        )


def diag_steps(options: ClusterOptions, node: str, where: str) -> dict[str, Step]:
    """The three steps of the diagnostic pod, by id, for a plan."""
    ns = diag_namespace_name(options)
    diag = diagnostic_pod(DIAG_NAME, ns, node, options.diag_image)
    path = resource_path("v1", "Pod", ns, DIAG_NAME)
    return {
        "diag-pod": Step(
            "diag-pod",
            "setup",
            f"privileged diagnostic pod (hostPID, nsenter) on {where}",
            api=(f"POST {resource_path('v1', 'Pod', ns)}", f"GET {path}  (until Running)"),
            manifest=manifest_yaml([diag]),
            arms="diag-delete",
        ),
        "diag-delete": Step(
            "diag-delete",
            "cleanup",
            "delete the diagnostic pod, wait until gone",
            api=(f"DELETE {path}",),
        ),
        "verify-diag-gone": Step(
            "verify-diag-gone", "verify", "diagnostic pod answers 404", api=(f"GET {path}",)
        ),
    }
