"""What tests/realnode/test_migration_live.py does to the cluster-mode nodes as an operator
would (helm for the two releases, kubectl to cordon, drain, relabel and uncordon), what it reads
back from the API server, and the timeline of what it measured (monotonic, each figure with what
it measures and the event it is counted from)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hv_device_plugin.api.dra_wire import RESOURCE_API
from hv_device_plugin.api.names import DRA_DRIVER, HYPERVISOR_RESOURCE
from hvconform.contract.deploy import CLUSTER_SCOPED
from hvconform.contract.wait import WaitExpired, wait_for
from hvconform.manifests.chart import chart_dir, helm_binary
from hvconform.targets.cluster.kube import KubeApi, Obj
from hvconform.targets.kindnode import BIN as KIND_BIN
from hvconform.targets.realnode import procs
from hvconform.targets.realnode.nodes import ADMIN_KUBECONFIG, NODE_CDI, NodeLayout

# kubectl is no system package bootstrap installs: the one `nox -s kind-image` builds from the
# pinned Kubernetes module, else one on PATH ("": the migration test says which to get)
KUBECTL = next(
    (str(k) for k in (KIND_BIN / "kubectl", shutil.which("kubectl")) if k and Path(k).is_file()),
    "",
)
WORK = "hv-migration-work"  # the workload pods' namespace
LIVE_S = 180.0
POOL_LABEL = "hyperlight.dev/pool"
CHART = chart_dir()
# the suite's values for a cluster whose nodes hold the images (pullPolicy: Never), as the
# shipped profiles' `cluster` values
TARGET_VALUES = CHART / "targets" / "kind.yaml"
COMPONENT = "app.kubernetes.io/component"
PART_OF = "app.kubernetes.io/part-of=hyperlight"
ADMISSION_API = "admissionregistration.k8s.io/v1"
RBAC_API = "rbac.authorization.k8s.io/v1"
# what a release of the chart may leave outside its namespace
CLUSTER_KINDS = (
    (RBAC_API, "ClusterRole"),
    (RBAC_API, "ClusterRoleBinding"),
    (ADMISSION_API, "ValidatingAdmissionPolicy"),
    (ADMISSION_API, "ValidatingAdmissionPolicyBinding"),
    (RESOURCE_API, "DeviceClass"),
)


@dataclass(frozen=True)
class Release:
    """One release of the chart: its name is its namespace too; its DaemonSets run on the
    nodes labelled hyperlight.dev/pool=<pool> only."""

    name: str
    mode: str
    pool: str

    def values(self, image: str) -> dict[str, Any]:
        repository, _, tag = image.rpartition(":")
        return {
            "mode": self.mode,
            "nodeSelector": {POOL_LABEL: self.pool},
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        }


def kubectl(*args: str, timeout: float = 240) -> str:
    argv = [KUBECTL, "--kubeconfig", str(ADMIN_KUBECONFIG), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr.strip()[-1500:]}"
    return done.stdout


def helm(*args: str, values: Mapping[str, Any] | None = None, timeout: float = 300) -> str:
    argv = [helm_binary(), *args]
    if values is not None:
        argv += ["--values", str(TARGET_VALUES), "--values", "-"]
    done = subprocess.run(
        argv,
        input=None if values is None else json.dumps(values),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr.strip()[-1500:]}"
    return done.stdout


def render(release: Release, image: str) -> list[Obj]:
    text = helm("template", release.name, str(CHART), "--namespace", release.name,
                values=release.values(image))  # fmt: skip
    return [o for o in yaml.safe_load_all(text) if o]


def cluster_scoped(objects: list[Obj]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] in CLUSTER_SCOPED}


def install(release: Release, image: str) -> None:
    """As the README's install: the namespace made and labelled, then `helm install`."""
    kubectl("create", "namespace", release.name)
    kubectl("label", "namespace", release.name, "pod-security.kubernetes.io/enforce=privileged")
    helm("install", release.name, str(CHART), "--namespace", release.name,
         "--kubeconfig", str(ADMIN_KUBECONFIG), values=release.values(image))  # fmt: skip


def uninstall(release: Release) -> None:
    helm("uninstall", release.name, "--namespace", release.name, "--ignore-not-found",
         "--kubeconfig", str(ADMIN_KUBECONFIG))  # fmt: skip


class Cluster:
    """Reads of the cluster through the admin kubeconfig."""

    def __init__(self, api: KubeApi, layouts: list[NodeLayout]) -> None:
        self.api = api
        self.layouts = {n.name: n for n in layouts}

    def extended(self, node: str, field: str) -> str | None:
        """The node's status.<capacity|allocatable> of hyperlight.dev/hypervisor (None: absent)."""
        obj = self.api.get("v1", "Node", node) or {}
        value = ((obj.get("status") or {}).get(field) or {}).get(HYPERVISOR_RESOURCE)
        return None if value is None else str(value)

    def pods(self, node: str, namespace: str = "", component: str = "") -> list[Obj]:
        labels = f"{COMPONENT}={component}" if component else ""
        return self.api.list_objects(
            "v1", "Pod", namespace, labels=labels, fields=f"spec.nodeName={node}"
        )

    def ready(self, node: str, namespace: str, component: str) -> bool:
        """One pod of the component on the node, Ready and not terminating."""
        return any(
            not p["metadata"].get("deletionTimestamp")
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in (p.get("status") or {}).get("conditions") or []
            )
            for p in self.pods(node, namespace, component)
        )

    def slices(self, node: str) -> list[Obj]:
        items = self.api.list_objects(RESOURCE_API, "ResourceSlice")
        return [
            s for s in items if s["spec"]["driver"] == DRA_DRIVER and s["spec"]["nodeName"] == node
        ]

    def claims(self, namespace: str) -> list[Obj]:
        return self.api.list_objects(RESOURCE_API, "ResourceClaim", namespace)

    def rolled_out(self, namespace: str) -> bool:
        """Every DaemonSet of the namespace on its one node, updated and ready."""
        sets = self.api.list_objects("apps/v1", "DaemonSet", namespace)
        return bool(sets) and all(
            (s.get("status") or {}).get("observedGeneration", 0) >= s["metadata"]["generation"]
            and s["status"].get("desiredNumberScheduled") == 1
            and s["status"].get("updatedNumberScheduled") == 1
            and s["status"].get("numberReady") == 1
            for s in sets
        )

    def claim_specs(self, node: str) -> list[str]:
        """The per-claim CDI specs in the node's own CDI dir (a tmpfs in its mount namespace,
        seen through its init's /proc/<pid>/root)."""
        init = procs.recorded(f"init-{node}")
        assert init is not None and init.alive, f"node {node}: no init process"
        cdi = Path(f"/proc/{init.pid}/root") / str(NODE_CDI).lstrip("/")
        return sorted(p.name for p in cdi.glob("hyperlight-claim-*.json"))

    def kubelet_log(self, node: str) -> Path:
        """The node's kubelet log (each line prefixed with the wall-clock time it was read)."""
        return self.layouts[node].run / "kubelet.log"

    def kubelet_lines(self, node: str, offset: int, *needles: str) -> list[str]:
        """The kubelet's lines after byte `offset` containing every needle."""
        with self.kubelet_log(node).open("rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        return [line for line in text.splitlines() if all(n in line for n in needles)]

    def counter_file(self, node: str, uid: str) -> Path:
        """A pod's `state` emptyDir, where its counter guest writes, under the node's kubelet
        root as the host sees it."""
        pod_dir = self.layouts[node].state / "kubelet" / "pods" / uid
        return pod_dir / "volumes" / "kubernetes.io~empty-dir" / "state" / "counter.json"


@dataclass
class Figure:
    seconds: float
    since: str
    what: str


class Timeline:
    """Monotonic events and the figures measured from them."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.events: dict[str, float] = {}
        self.figures: dict[str, Figure] = {}
        self.observed: dict[str, Any] = {}

    def event(self, name: str) -> None:
        self.events[name] = time.monotonic()

    def since(self, origin: str, key: str, what: str) -> float:
        seconds = round(time.monotonic() - self.events[origin], 2)
        self.figures[key] = Figure(seconds, origin, what)
        return seconds

    def first_of(
        self,
        origin: str,
        conditions: Mapping[str, tuple[str, Callable[[], bool]]],
        timeout: float,
        description: str,
        *,
        watch: Callable[[], None] | None = None,
        interval: float = 0.25,
    ) -> None:
        """Poll until every condition held once; each figure is when it first held. `watch`
        is called at every poll (to record what is seen meanwhile)."""
        pending = dict(conditions)

        def step() -> bool:
            if watch is not None:
                watch()
            for key, (what, held) in list(pending.items()):
                if held():
                    self.since(origin, key, what)
                    del pending[key]
            return not pending

        try:
            wait_for(step, timeout, description, interval)
        except WaitExpired as exc:
            raise WaitExpired(f"{exc}; still not seen: {', '.join(pending)}") from None

    def as_json(self) -> dict[str, Any]:
        return {
            "events_s": {k: round(v - self.t0, 2) for k, v in self.events.items()},
            "figures": {
                k: {"seconds": f.seconds, "since": f.since, "what": f.what}
                for k, f in self.figures.items()
            },
            "observed": self.observed,
        }

    def lines(self) -> list[str]:
        return [
            f"  {k:<30} {f.seconds:8.2f} s  since {f.since}: {f.what}"
            for k, f in self.figures.items()
        ] + [f"  {k:<30} {v}" for k, v in self.observed.items()]
