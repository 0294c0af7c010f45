"""The cluster family's hooks for the suite: kind and AKS preconditions, the tools' versions,
and what the cluster itself ran (server version and every Node's kubelet, container runtime,
OS image and kernel, from the Node objects; the feature gates its components report enabled).

The suite talks to the API server with its own client and renders the manifests with helm, so
those are what a cluster run needs on this machine: kind and a Docker engine that answers for
KIND, az for AKS, helm for both. kubectl is not used; its version is recorded when present.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hvconform.contract import featuregates
from hvconform.contract.preconditions import Requirement, tool, version_of
from hvconform.manifests.chart import helm_requirement
from hvconform.targets.cluster.kindbin import KIND_VERSION
from hvconform.targets.cluster.kube import ApiError, KubeApi, resource_path

# kind writes the node's kubeadm config; kubeadm v1.36+ refuses v1beta3, and v0.32 is the first
# kind that writes v1beta4 for them (older node images work with it too). An older kind on PATH
# was why kind create failed in CI ("your configuration file uses an old API spec").
KIND_MINIMUM = "0.32"
AZ_MINIMUM = "2.50"  # az aks nodepool add --node-taints/--labels as the plan uses them


def _helm() -> Requirement:
    return helm_requirement(
        "the plugin's manifests are the chart's render",
        "nox -s conformance-kind / conformance-aks build it, or set HV_HELM",
    )


def _docker_engine() -> Requirement:
    return tool(
        "Docker engine",
        ["docker", "version", "--format", "{{.Server.Version}}"],
        minimum="20.10",
        feature="kind's nodes are containers of this engine",
        fix="start the Docker engine (systemctl start docker) or install docker.io",
    )


def preconditions(target: str, runtime: str = "process") -> list[Requirement]:
    del runtime
    if target == "cluster":  # the caller's cluster: only its kubeconfig, checked by the run
        return [_helm()]
    if target == "aks":
        az = tool(
            "az",
            ["az", "version", "--output", "tsv", "--query", '"azure-cli"'],
            minimum=AZ_MINIMUM,
            feature="adding and deleting the temporary AKS node pool",
            fix="install the Azure CLI (apt-get install azure-cli) and az login",
        )
        return [az, _helm()]
    kind = tool(
        "kind",
        ["kind", "version"],
        minimum=KIND_MINIMUM,
        feature="creating and deleting the throwaway cluster",
        fix=f"nox -s kind-image (builds kind {KIND_VERSION} into its cache), or "
        f"go install sigs.k8s.io/kind@{KIND_VERSION} and put it first on PATH",
        pattern=r"kind v?(\S+)",
    )
    return [_docker_engine(), kind, _helm()]


def environment(target: str, runtime: str = "process") -> dict[str, Any]:
    """The local tools a cluster run used."""
    del runtime
    tools = {"kubectl": version_of(["kubectl", "version", "--client"], r"Client Version: (\S+)")}
    if target == "aks":
        tools["az"] = version_of(["az", "version", "--output", "tsv", "--query", '"azure-cli"'])
    elif target != "cluster":
        tools["kind"] = version_of(["kind", "version"], r"kind v?(\S+)")
        tools["docker engine"] = version_of(
            ["docker", "version", "--format", "{{.Server.Version}}"]
        )
    return {"components": tools}


def cluster_facts(api: KubeApi) -> dict[str, Any]:
    """Server version and every Node's versions, as the API server reports them."""
    facts: dict[str, Any] = {}
    try:
        _, data = api.request("GET", "/version")
        version = json.loads(data or b"{}")
        facts["server_version"] = str(version.get("gitVersion", "unknown"))
    except (ApiError, ValueError) as exc:
        facts["server_version"] = f"unavailable ({exc})"
    try:
        nodes = api.list_objects("v1", "Node")
    except ApiError as exc:
        facts["nodes"] = []
        facts["nodes_error"] = str(exc)
        return facts
    facts["nodes"] = [
        {
            "name": str(n.get("metadata", {}).get("name", "")),
            "kubelet": str(info.get("kubeletVersion", "")),
            "container_runtime": str(info.get("containerRuntimeVersion", "")),
            "os_image": str(info.get("osImage", "")),
            "kernel": str(info.get("kernelVersion", "")),
        }
        for n in nodes
        for info in [n.get("status", {}).get("nodeInfo", {})]
    ]
    return facts


def record_feature_gates(
    api: KubeApi, node: str, set_by_target: dict[str, Any], out_dir: Path
) -> Path:
    """The run dir's feature-gates file: what the target set, the API server's own word (its
    /metrics, which an admin kubeconfig may read; a managed control plane may refuse it) and the
    kubelet's of the node under test (its /metrics through the API server's node proxy, which
    needs nodes/proxy). Whatever is refused is recorded with the reason; the run goes on."""
    if node:
        proxy = resource_path("v1", "Node", name=node) + "/proxy/metrics"
        kubelet = featuregates.read(lambda: api.text(proxy))
    else:
        kubelet = featuregates.unread("no node under test named")
    api_server = featuregates.read(lambda: api.text("/metrics"))
    return featuregates.record(out_dir, set_by_target, api_server, kubelet, node)
