"""Objects the cluster harness adds or adjusts: workload and diagnostic pods, fault variants.

The rendered manifests stay the plugin's own; the harness changes only test-fixture wiring, and
says so in `Layout`: the host-device view becomes an isolated directory (so identity faults never
touch the real /dev), AKS pods tolerate the run's taint and stay on its pool, and two fault
variants (an empty socket dir; /dev/null at the device path) are whole-DaemonSet replacements.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from hv_device_plugin.api.names import DEVICE_ACCESS_RESOURCE, HYPERVISOR_RESOURCE
from hv_device_plugin.api.wire import CDI_DYNAMIC_DIR, DEVICE_PLUGIN_DIR
from hvconform.contract.deploy import Pods
from hvconform.contract.plugin import HYPERVISOR_DEVICES, Paths
from hvconform.targets.cluster.access import EMPTY_SOCKETS, HOST_VIEW
from hvconform.targets.cluster.kube import Obj

RESOURCE = HYPERVISOR_RESOURCE
ACCESS_RESOURCE = DEVICE_ACCESS_RESOURCE
RUN_LABEL = "hyperlight.dev/conformance-run"
TAINT_KEY = "hyperlight.dev/conformance"
MANAGED = {"app.kubernetes.io/managed-by": "hvconform"}
# Every object a run creates carries it (value: ClusterOptions.run_label): what cleanup of a
# killed run (`hvconform cleanup --run-id`) and the run's own verification list by.
RUN_ID_LABEL = "hvconform/run-id"
DEVICE_PLUGINS_DIR = DEVICE_PLUGIN_DIR
STATE_MOUNT = "/state"
GUEST_MODULE = ["python3", "-m", "hvconform.guest"]  # the debootstrap base has no `python`


@dataclass
class Layout:
    """Where the harness found things in the rendered plugin DaemonSet."""

    daemonset: str = ""
    namespace: str = ""
    container: str = ""
    selector: dict[str, str] = field(default_factory=dict)
    health_port: int | None = None
    # the pod's Ready / ContainersReady conditions mean something only with these probes
    readiness_probe: bool = False
    liveness_probe: bool = False
    host_view_isolated: bool = False
    cdi_propagates: bool = False  # hostPath mounts made later on the node reach the plugin
    sockets_volume: str = ""
    # where the plugin container sees them (faults made inside its own mount namespace)
    # "sockets", "cdi", "host_dev", "device" -> the path in the container
    mounts: dict[str, str] = field(default_factory=dict)
    # where the node keeps them (hostPath): a kubelet root other than /var/lib/kubelet (k0s,
    # microk8s) or another CDI dir is read from the objects, never assumed
    node_dirs: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _pod_spec(ds: Obj) -> Obj:
    spec: Obj = ds["spec"]["template"]["spec"]
    return spec


def _uses_access(container: Obj) -> bool:
    res = container.get("resources", {})
    return any(ACCESS_RESOURCE in (res.get(k) or {}) for k in ("limits", "requests"))


def _matches(ds: Obj, pods: Pods) -> bool:
    labels = ds["spec"]["template"].get("metadata", {}).get("labels", {}) or {}
    names = [c.get("name") for c in _pod_spec(ds).get("containers", [])]
    return all(labels.get(k) == v for k, v in pods.labels.items()) and pods.container in names


def plugin_daemonset(objects: list[Obj], pods: Pods | None = None) -> Obj:
    """The plugin's DaemonSet: the one whose pods the profile's `deploy.pods` describes (without
    one: the one that consumes the bootstrap access resource)."""
    sets = [o for o in objects if o.get("kind") == "DaemonSet"]
    if not sets:
        raise ValueError("the rendered manifests contain no DaemonSet")
    if pods is not None:
        found = [ds for ds in sets if _matches(ds, pods)]
        if not found:
            raise ValueError(f"no DaemonSet has pods labelled {dict(pods.labels)} with a "
                             f"container {pods.container!r} (the profile's deploy.pods)")  # fmt: skip
        return found[0]
    for ds in sets:
        if any(_uses_access(c) for c in _pod_spec(ds).get("containers", [])):
            return ds
    plain = [ds for ds in sets if "access" not in ds["metadata"]["name"]]
    return (plain or sets)[0]


def _plugin_container(ds: Obj, pods: Pods | None = None) -> Obj:
    containers: list[Obj] = _pod_spec(ds)["containers"]
    if pods is not None:
        return next(c for c in containers if c.get("name") == pods.container)
    return next((c for c in containers if _uses_access(c)), containers[0])


def _health_port(container: Obj) -> int | None:
    args = [*container.get("command", []), *container.get("args", [])]
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--health-addr=") else ""
        if arg == "--health-addr" and i + 1 < len(args):
            value = args[i + 1]
        if value:
            return int(value.rsplit(":", 1)[1])
    for env in container.get("env", []):
        if env.get("name") == "HV_HEALTH_ADDR" and ":" in str(env.get("value", "")):
            return int(str(env["value"]).rsplit(":", 1)[1])
    probe = container.get("readinessProbe", {}).get("httpGet", {})
    port = probe.get("port")
    return port if isinstance(port, int) else None


def _mount_of(container: Obj, volume: str) -> Obj:
    return next((m for m in container.get("volumeMounts", []) if m.get("name") == volume), {})


def _role(host_path: str, mount_path: str, paths: Paths | None) -> str:
    """What a hostPath volume is to the plugin: by where the profile says the plugin looks (its
    in-container paths), else by the standard host paths."""
    if host_path == "/dev":
        return "host_dev"
    if host_path in HYPERVISOR_DEVICES and mount_path == host_path:
        return "device"  # the device itself, at its own path (a CharDevice hostPath)
    if paths is not None and mount_path:
        by_mount = {paths.device_plugin_dir: "sockets", paths.cdi_dir: "cdi"}
        if mount_path.rstrip("/") in by_mount:
            return by_mount[mount_path.rstrip("/")]
    return {CDI_DYNAMIC_DIR: "cdi", DEVICE_PLUGINS_DIR: "sockets"}.get(host_path, "")


def prepare(
    objects: list[Obj],
    *,
    pin_labels: dict[str, str] | None = None,
    taint: bool = False,
    isolate_host_view: bool = True,
    pods: Pods | None = None,
    paths: Paths | None = None,
) -> tuple[list[Obj], Layout]:
    """Copy the rendered objects with the harness wiring applied; report what was found.

    `isolate_host_view=False` (the existing-cluster target: manifests applied unchanged) keeps
    the plugin's view of the node's real /dev, so no identity fault is ever made there."""
    out = copy.deepcopy(objects)
    ds = plugin_daemonset(out, pods)
    container = _plugin_container(ds, pods)
    layout = Layout(
        daemonset=ds["metadata"]["name"],
        namespace=ds["metadata"].get("namespace", ""),
        container=container["name"],
        selector=dict(ds["spec"]["selector"].get("matchLabels", {})),
        health_port=_health_port(container),
        readiness_probe="readinessProbe" in container,
        liveness_probe="livenessProbe" in container,
    )
    for vol in _pod_spec(ds).get("volumes", []):
        path = vol.get("hostPath", {}).get("path", "").rstrip("/")
        where = _mount_of(container, vol["name"]).get("mountPath")
        role = _role(path, str(where or ""), paths)
        if role and where:
            layout.mounts[role] = str(where)
            layout.node_dirs[role] = path
        if path == "/dev" and isolate_host_view:
            vol["hostPath"] = {"path": HOST_VIEW, "type": "Directory"}
            layout.host_view_isolated = True
        elif path == "/dev":
            layout.notes.append(
                "manifests applied unchanged: the plugin sees the node's real /dev; identity "
                "faults are made only inside the plugin container, or not at all"
            )
        elif role == "cdi":
            prop = _mount_of(container, vol["name"]).get("mountPropagation", "None")
            layout.cdi_propagates = prop in ("HostToContainer", "Bidirectional")
        elif role == "sockets":
            layout.sockets_volume = vol["name"]
    if not layout.host_view_isolated and not layout.notes and "device" not in layout.mounts:
        layout.notes.append("no hostPath /dev host-device view found: identity faults unavailable")
    for obj in out:
        if obj.get("kind") != "DaemonSet":
            continue
        spec = _pod_spec(obj)
        if pin_labels:
            spec.setdefault("nodeSelector", {}).update(pin_labels)
        if taint:
            spec.setdefault("tolerations", []).append(
                {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
            )
    return out, layout


def variant_sockets_empty(ds: Obj, layout: Layout) -> Obj:
    """The plugin sees an empty directory where the kubelet's sockets are."""
    variant = copy.deepcopy(ds)
    for vol in _pod_spec(variant).get("volumes", []):
        if vol["name"] == layout.sockets_volume:
            vol["hostPath"] = {"path": EMPTY_SOCKETS, "type": "DirectoryOrCreate"}
    return variant


def variant_device_unusable(ds: Obj, layout: Layout, device: str) -> Obj:
    """/dev/null's node at the device path inside the plugin container (no bootstrap device)."""
    variant = copy.deepcopy(ds)
    spec = _pod_spec(variant)
    container = next(c for c in spec["containers"] if c["name"] == layout.container)
    for key in ("limits", "requests"):
        (container.get("resources", {}).get(key) or {}).pop(ACCESS_RESOURCE, None)
    spec.setdefault("volumes", []).append(
        {"name": "hvconform-null", "hostPath": {"path": "/dev/null", "type": "CharDevice"}}
    )
    container.setdefault("volumeMounts", []).append({"name": "hvconform-null", "mountPath": device})
    return variant


def namespace(name: str, *, restricted: bool = False) -> Obj:
    labels = dict(MANAGED)
    if restricted:
        labels["pod-security.kubernetes.io/enforce"] = "restricted"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def _tolerations(taint: bool) -> list[Obj]:
    return [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}] if taint else []


def workload_pod(
    name: str,
    ns: str,
    node: str,
    image: str,
    device: str,
    *,
    taint: bool,
    guest: bool,
    resource: str = RESOURCE,
) -> Obj:
    """Requests one hypervisor slot; runs the compute guest once, then the counter guest.

    nodeName skips the scheduler: the kubelet's own admission answers (UnexpectedAdmissionError),
    which is what the checks observe. The counter state lives in an emptyDir the harness reads
    from the node. Without a guest for this hypervisor (MSHV) the pod only holds the device.
    """
    mod = " ".join(GUEST_MODULE)
    script = (
        f'{mod} run --json --device "$0"; '
        f'exec {mod} counter --device "$0" --state-file {STATE_MOUNT}/counter.json --interval 0.1'
        if guest
        else 'test -c "$0" && exec sleep 86400'
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {**MANAGED, "hvconform/role": "guest"},
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 5,
            "tolerations": _tolerations(taint),
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65534,
                "runAsGroup": 65534,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "guest",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", script, device],
                    "resources": {"limits": {resource: "1"}, "requests": {resource: "1"}},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [{"name": "state", "mountPath": STATE_MOUNT}],
                }
            ],
            "volumes": [{"name": "state", "emptyDir": {"sizeLimit": "1Mi"}}],
        },
    }


def diagnostic_pod(name: str, ns: str, node: str, image: str) -> Obj:
    """Privileged, hostPID: `nsenter -t 1` from here is the node. Created and removed by us."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {**MANAGED, "hvconform/role": "diag"},
        },
        "spec": {
            "nodeName": node,
            "hostPID": True,
            "hostNetwork": True,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "diag",
                    "image": image,
                    "command": ["sleep", "86400"],
                    # root whatever the image's USER: nsenter into the node needs it
                    "securityContext": {"privileged": True, "runAsUser": 0},
                }
            ],
        },
    }
