"""How a plugin that runs in a container is deployed: the `deploy` section of a plugin profile.

A profile that can run where plugins really run (a container runtime, a node's containerd, a
cluster) says which image is the plugin, which Kubernetes objects deploy it (a Helm chart with
values per target, or manifest files), and how the suite finds its pods: the namespace, the pod
labels and the plugin's container. The suite applies those objects as given apart from the
documented overrides (README "Testing your own plugin"): the image of the plugin container (the
profile's `image`, or `--image`), the namespace the chart is rendered into, node selection and
the conformance pool's toleration. Everything here is validated before anything runs; paths are
resolved against the profile's directory, and a file is only named here, read by the renderer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from hvconform.contract import imageref
from hvconform.contract.errors import ProfileError
from hvconform.contract.profile_rules import known_keys
from hvconform.contract.safeyaml import excerpt

_DNS_LABEL = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY = re.compile(
    r"^(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
# Keys a chart's `values` map may use: a target name, or "*" for every target without its own.
VALUES_KEYS = ("*", "kind", "aks", "aks-mshv", "cluster", "cluster-mshv", "node", "local")
# Beside the targets' own keys (VALUES_KEYS, chosen by default), a profile may name its own for
# clusters of its kind (openshift, k3s, ...): a run picks one with --values-for.
_OWN_KEY = re.compile(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?")


def values_key_problem(key: object) -> str | None:
    """Why `key` cannot name a per-target values (or manifests) entry; None when it can."""
    if isinstance(key, str) and (key in VALUES_KEYS or _OWN_KEY.fullmatch(key)):
        return None
    return (
        f"key {key!r:.40} is neither a target's ({', '.join(VALUES_KEYS)}) nor a name of your "
        "own (a-z, 0-9 and '-', at most 40; chosen with --values-for)"
    )


_DEPLOY_KEYS = {"image", "chart", "manifests", "pods"}
_CHART_KEYS = {"path", "values", "set"}
_POD_KEYS = {"namespace", "labels", "container"}
MAX_FILES = 32


# Kinds whose objects have no namespace: the fallback for a plan made before any cluster exists
# (kind, AKS); a real run asks the cluster's discovery and refuses an object whose scope there
# differs from this table's (hvconform.targets.cluster.deploy).
CLUSTER_SCOPED = frozenset(
    {
        "Namespace", "Node", "PersistentVolume", "ComponentStatus",
        "ClusterRole", "ClusterRoleBinding", "PriorityClass", "RuntimeClass",
        "CustomResourceDefinition", "APIService", "StorageClass", "CSIDriver", "CSINode",
        "VolumeAttachment", "VolumeAttributesClass", "IngressClass", "PodSecurityPolicy",
        "CertificateSigningRequest", "ClusterTrustBundle", "FlowSchema",
        "PriorityLevelConfiguration", "StorageVersionMigration",
        "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
        "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
        "DeviceClass", "ResourceSlice", "DeviceTaintRule",
    }
)  # fmt: skip


def table_namespaced(api_version: str, kind: str) -> bool:
    """The fallback table's scope of a kind (any version): namespaced unless listed above."""
    return kind not in CLUSTER_SCOPED


@dataclass(frozen=True)
class Pods:
    """How the suite finds the plugin's pods and its container in them."""

    labels: Mapping[str, str]
    container: str
    namespace: str = ""  # empty: the namespace the target renders the objects into


@dataclass(frozen=True)
class Chart:
    path: str  # the chart directory, absolute
    values: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # target -> files
    set: Mapping[str, Any] = field(default_factory=dict)  # values on top, every target

    def values_for(self, target: str) -> tuple[str, ...]:
        return self.values.get(target, self.values.get("*", ()))


@dataclass(frozen=True)
class Deploy:
    image: str
    pods: Pods
    chart: Chart | None = None
    # target (or "*") -> absolute paths of multi-document YAML files; a plain list is "*"
    manifests: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def manifests_for(self, target: str) -> tuple[str, ...]:
        return self.manifests.get(target, self.manifests.get("*", ()))

    def keys(self) -> tuple[str, ...]:
        """The per-target keys the profile names: its chart's values map, or its manifests."""
        return tuple(self.chart.values if self.chart is not None else self.manifests)

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "chart": None
            if self.chart is None
            else {
                "path": self.chart.path,
                "values": {k: list(v) for k, v in self.chart.values.items()},
                "set": dict(self.chart.set),
            },
            "manifests": {k: list(v) for k, v in self.manifests.items()},
            "pods": {
                "namespace": self.pods.namespace,
                "labels": dict(self.pods.labels),
                "container": self.pods.container,
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Deploy:
        chart = data.get("chart")
        pods = data["pods"]
        return cls(
            image=data["image"],
            chart=None
            if chart is None
            else Chart(
                path=chart["path"],
                values={k: tuple(v) for k, v in chart["values"].items()},
                set=dict(chart["set"]),
            ),
            manifests={k: tuple(v) for k, v in data["manifests"].items()},
            pods=Pods(
                labels=dict(pods["labels"]),
                container=pods["container"],
                namespace=pods["namespace"],
            ),
        )


def image_problem(image: str) -> str | None:
    """Why `image` cannot be deployed reproducibly, or None: a reference (hvconform.contract.
    imageref) pinned by a tag other than latest, or a digest (kind never re-pulls a mutable
    tag, and a node would pull another image)."""
    return imageref.problem(image, pinned=True)


def _file(value: Any, where: str, base: Path, *, directory: bool = False) -> str:
    if not isinstance(value, str) or not value or "\x00" in value or "\n" in value:
        raise ProfileError(f"{where}: want a path (relative to the profile), got {value!r:.60}")
    path = (base / value).resolve() if not PurePosixPath(value).is_absolute() else Path(value)
    ok = path.is_dir() if directory else path.is_file()
    if not ok:
        kind = "directory" if directory else "regular file"
        raise ProfileError(f"{where}: {str(path)!r:.120} is not a {kind}")
    return str(path)


def _labels(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not value:
        raise ProfileError(f"{where}: want a non-empty mapping of pod labels")
    for k, v in value.items():
        if not isinstance(k, str) or not _LABEL_KEY.fullmatch(k):
            raise ProfileError(f"{where}: {k!r:.60} is not a label key")
        if not isinstance(v, str) or not _LABEL_VALUE.fullmatch(v):
            raise ProfileError(f"{where}.{k}: {v!r:.60} is not a label value")
    return dict(value)


def _pods(value: Any, where: str) -> Pods:
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: want a mapping with labels and container")
    known_keys(value, _POD_KEYS, where)
    container = value.get("container")
    if not isinstance(container, str) or not _DNS_LABEL.fullmatch(container):
        raise ProfileError(f"{where}.container: want a container name, got {container!r:.60}")
    ns = value.get("namespace", "")
    if not isinstance(ns, str) or (ns and not _DNS_LABEL.fullmatch(ns)):
        raise ProfileError(f"{where}.namespace: want a namespace name, got {ns!r:.60}")
    return Pods(_labels(value.get("labels"), f"{where}.labels"), container, ns)


def _chart(value: Any, where: str, base: Path) -> Chart:
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: want a mapping with path, values and set")
    known_keys(value, _CHART_KEYS, where)
    path = _file(value.get("path"), f"{where}.path", base, directory=True)
    if not (Path(path) / "Chart.yaml").is_file():
        raise ProfileError(f"{where}.path: {path!r:.120} has no Chart.yaml")
    raw = value.get("values") or {}
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}.values: want a mapping of target name to values files")
    values: dict[str, tuple[str, ...]] = {}
    for key, files in raw.items():
        if problem := values_key_problem(key):
            raise ProfileError(f"{where}.values: {problem}")
        if not isinstance(files, list) or len(files) > MAX_FILES:
            raise ProfileError(f"{where}.values.{key}: want a list of at most {MAX_FILES} files")
        values[key] = tuple(
            _file(f, f"{where}.values.{key}[{i}]", Path(path)) for i, f in enumerate(files)
        )
    fixed = value.get("set") or {}
    if not isinstance(fixed, dict):
        raise ProfileError(f"{where}.set: want a mapping of chart values")
    return Chart(path, values, fixed)


def parse_deploy(value: Any, where: str, base: Path) -> Deploy | None:
    """The `deploy` section (None when absent); ProfileError, one line, for anything unusable."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: want a mapping with image, chart or manifests, and pods")
    known_keys(value, _DEPLOY_KEYS, where)
    image = value.get("image")
    if not isinstance(image, str):
        raise ProfileError(f"{where}.image: want an image reference, got {excerpt(image)}")
    problem = image_problem(image)
    if problem:
        raise ProfileError(f"{where}.image: {problem}")
    has_chart, has_files = value.get("chart") is not None, value.get("manifests") is not None
    if has_chart == has_files:
        raise ProfileError(f"{where}: give exactly one of chart and manifests")
    files: dict[str, tuple[str, ...]] = {}
    if has_files:
        raw = value["manifests"]
        by_target = raw if isinstance(raw, dict) else {"*": raw}
        for key, listed in by_target.items():
            at = f"{where}.manifests" + ("" if raw is listed else f".{key}")
            if problem := values_key_problem(key):
                raise ProfileError(f"{at}: {problem}")
            if not isinstance(listed, list) or not listed or len(listed) > MAX_FILES:
                raise ProfileError(f"{at}: want a list of 1..{MAX_FILES} files")
            files[key] = tuple(_file(f, f"{at}[{i}]", base) for i, f in enumerate(listed))
    return Deploy(
        image=image,
        chart=_chart(value["chart"], f"{where}.chart", base) if has_chart else None,
        manifests=files,
        pods=_pods(value.get("pods"), f"{where}.pods"),
    )
