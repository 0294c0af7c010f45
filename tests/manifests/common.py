"""Shared helpers: cached renders handed out as deep copies, and walkers over workloads."""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from typing import Any

from hvconform.manifests import TARGETS, render_objects

IMAGE = "hv-device-plugin:1.2.3"
DAEMONSETS = ("device-access", "hypervisor-plugin")


@functools.cache
def _rendered(target: str) -> tuple[dict[str, Any], ...]:
    return tuple(render_objects(target, image=IMAGE))


def objects(target: str) -> list[dict[str, Any]]:
    """A fresh, mutable copy of the default render of `target`."""
    return copy.deepcopy(list(_rendered(target)))


def daemonset(objs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    """The DaemonSet whose app.kubernetes.io/component is `component`."""
    found = [
        o
        for o in objs
        if o["kind"] == "DaemonSet"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    assert len(found) == 1, f"expected one {component} DaemonSet, found {len(found)}"
    return found[0]


def pod_spec(ds: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def every_container(objs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, container) for every container and initContainer of every DaemonSet."""
    for obj in objs:
        if obj["kind"] != "DaemonSet":
            continue
        pod = pod_spec(obj)
        for field in ("initContainers", "containers"):
            for container in pod.get(field, []):
                yield f"{obj['metadata']['name']} {field}[{container['name']}]", container


ALL_TARGETS = list(TARGETS)
