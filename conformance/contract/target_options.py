"""The typed options of the targets that run on this machine without a cluster, defined once.

Each target owns its flags (its family's `options` module adds them to the parser and builds
one of these from them); the run context carries the one object of the chosen target, typed,
to every process of the run. The cluster targets' object is `ClusterOptions`
(hvconform.contract.cluster_options). They live in the contract, below the targets, because
the run context reads them back; nothing here names a target.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class LocalOptions:
    """The local target's: how the plugin and the workloads run on this machine."""

    FAMILY: ClassVar[str] = "local"
    runtime: str = "process"  # "process": sandboxed processes; "container": the plugin's image
    # --runtime container: the Docker engine of the plugin container; "": a private dockerd
    docker_host: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LocalOptions:
        return cls(runtime=str(data["runtime"]), docker_host=str(data.get("docker_host", "")))


@dataclass(frozen=True)
class NodeOptions:
    """The real-node target's: which container runtime its node runs."""

    FAMILY: ClassVar[str] = "node"
    node_runtime: str = ""  # a key of realnode.runtimes.RUNTIMES; "": its default (1.7)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeOptions:
        return cls(node_runtime=str(data.get("node_runtime", "")))
