"""The Kubernetes objects a plugin profile deploys, rendered for one target and one namespace.

A profile's `deploy` section names a Helm chart (values files per target, fixed values on top)
or manifest files. They are rendered as given; the suite then makes only the overrides README
documents, each recorded as a note so the plan says what changed:
- the namespace: namespaced objects go into the run's plugin namespace (on AKS and existing
  clusters a namespace of the run's own, so cleanup can never delete someone else's install);
- the image: every container that ran the plugin container's rendered image runs the image the
  run deploys (the profile's `image`, or `--image`), so what the report names is what runs.
Node selection and the pool toleration are the cluster targets' own wiring (workloads.prepare).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hvconform.contract.deploy import CLUSTER_SCOPED, Deploy
from hvconform.contract.results import EnvironmentBlocked
from hvconform.contract.safeyaml import (
    MAX_FILE_BYTES,
    Budget,
    UnsafeInput,
    excerpt,
    read_bounded,
)
from hvconform.manifests.chart import (
    ChartError,
    HelmMissing,
    ObjectError,
    load_objects,
    template,
)
from hvconform.manifests.render import ManifestError

Obj = dict[str, Any]


@dataclass
class Rendered:
    objects: list[Obj]
    image: str  # what the plugin container runs after the override
    rendered_image: str  # what the profile's objects said before it
    notes: list[str] = field(default_factory=list)


def _read_manifest(path: str) -> str:
    """A regular file of at most MAX_FILE_BYTES, not a symlink (no FIFO, no device, no unbounded
    read); what a run reads in all is parse_objects' Budget's to bound."""
    try:
        data = read_bounded(path, MAX_FILE_BYTES, follow=False)
    except UnsafeInput as exc:
        raise ManifestError(f"manifest {exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestError(f"manifest {excerpt(path, 160)}: not UTF-8 text") from None


def parse_objects(text: str, where: str, budget: Budget | None = None) -> list[Obj]:
    """The Kubernetes objects of one manifest or helm output: the strict loader (no aliases, no
    duplicate keys, bounded numbers and depth), each document an object with apiVersion, kind
    and a valid metadata.name or generateName. Pass one Budget for every file of a run: the
    caps (MAX_RUN_BYTES, MAX_DOCUMENTS) are per run; without one, this text is the run."""
    try:
        return load_objects(text, where, budget)
    except ObjectError as exc:
        raise ManifestError(str(exc)) from None


def _pod_spec(obj: Obj) -> Obj | None:
    spec = obj.get("spec", {}).get("template", {}).get("spec")
    return spec if isinstance(spec, dict) else None


def plugin_workload(objects: list[Obj], deploy: Deploy) -> tuple[Obj, Obj]:
    """The DaemonSet whose pods carry the profile's labels, and its plugin container."""
    want = dict(deploy.pods.labels)
    for obj in objects:
        spec = _pod_spec(obj)
        if obj["kind"] != "DaemonSet" or spec is None:
            continue
        labels = obj["spec"]["template"].get("metadata", {}).get("labels", {}) or {}
        if all(labels.get(k) == v for k, v in want.items()):
            for container in spec.get("containers", []):
                if container.get("name") == deploy.pods.container:
                    return obj, container
    raise ManifestError(
        f"no DaemonSet in the profile's objects has pods labelled {want} with a container "
        f"named {deploy.pods.container!r} (deploy.pods)"
    )


def render_deploy(
    deploy: Deploy,
    target: str,
    *,
    namespace: str,
    image: str = "",
    extra_values: Sequence[str] = (),
) -> Rendered:
    """The profile's objects for `target` (a per-target key) in `namespace`, with the plugin
    image overridden; `extra_values`: the user's values files on top of the profile's."""
    if deploy.chart is not None:
        chart = deploy.chart
        try:
            text = template(
                namespace,
                [Path(f) for f in (*chart.values_for(target), *extra_values)],
                dict(chart.set),
                chart=Path(chart.path),
            )
        except HelmMissing as exc:
            raise EnvironmentBlocked(str(exc)) from None
        except ChartError as exc:
            text = str(exc)  # chart.py's errors name the chart already
            raise ManifestError(
                text if text.startswith("chart ") else f"chart {chart.path}: {text}"
            ) from None
        objects = parse_objects(text, f"helm template {chart.path}")
    else:
        objects = []
        files = deploy.manifests_for(target)
        if not files:
            raise ManifestError(f"deploy.manifests: none for target {target!r} and no '*' entry")
        budget = Budget()  # one budget for every file of the run: caps per run, not per file
        for path in files:
            objects += parse_objects(_read_manifest(path), path, budget)
    objects = copy.deepcopy(objects)
    notes: list[str] = []
    moved = 0
    for obj in objects:
        if obj["kind"] not in CLUSTER_SCOPED and obj["metadata"].get("namespace") != namespace:
            obj["metadata"]["namespace"] = namespace
            moved += 1
    if moved:
        notes.append(f"override: {moved} namespaced object(s) applied in namespace {namespace}")
    _, container = plugin_workload(objects, deploy)
    before = str(container.get("image", ""))
    wanted = image or deploy.image
    if before != wanted:
        replaced = 0
        for obj in objects:
            spec = _pod_spec(obj)
            for c in (
                []
                if spec is None
                else [*spec.get("initContainers", []), *spec.get("containers", [])]
            ):
                if c.get("image") == before:
                    c["image"] = wanted
                    replaced += 1
        notes.append(f"override: image {before or '(none)'} -> {wanted} in {replaced} container(s)")
    return Rendered(objects, wanted, before, notes)
