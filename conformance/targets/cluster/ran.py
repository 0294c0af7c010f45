"""What runs as the plugin on a cluster node, read back from its pod (never from the profile).

The plugin container's image as the pod's spec names it (what the DaemonSet made), the image ID
the kubelet reports in the container's status (what the runtime really runs: a digest), and the
container's command and args. A pod the kubelet has not started yet has no image ID: that is
recorded as empty, and the suite's identity rule decides what it proves.
"""

from __future__ import annotations

from hvconform.contract.ran import PluginRan
from hvconform.targets.cluster.kube import Obj


def pod_ran(pod: Obj, container: str) -> PluginRan:
    """The plugin container `container` of `pod`, as the API server has it."""
    meta = pod.get("metadata", {})
    where = f"{meta.get('namespace', '?')}/{meta.get('name', '?')}"
    spec = pod.get("spec", {})
    found = [c for c in spec.get("containers", []) if c.get("name") == container]
    if not found:
        raise RuntimeError(f"plugin pod {where} has no container {container!r}")
    statuses = pod.get("status", {}).get("containerStatuses") or []
    status: Obj = next((s for s in statuses if s.get("name") == container), {})
    command = [str(a) for a in found[0].get("command") or []]
    args = [str(a) for a in found[0].get("args") or []]
    notes = [f"container {container!r}"]
    if not command:
        with_args = " with these args" if args else ""
        notes.append(f"no command in the pod spec: the image's entrypoint runs{with_args}")
    if status.get("image"):
        notes.append(f"the kubelet reports image {status['image']}")
    if status.get("containerID"):
        notes.append(f"runtime container {status['containerID']}")
    if spec.get("nodeName"):
        notes.append(f"node {spec['nodeName']}")
    return PluginRan(
        how="pod",
        argv=(*command, *args),
        image=str(found[0].get("image", "")),
        image_id=str(status.get("imageID", "")),
        where=where,
        notes=tuple(notes),
    )
