"""What a plugin's DaemonSet says about the plugin: the facts `hvconform profile init` writes.

The objects come from the strict loader (a manifest file, or helm's capped output), so they are
Kubernetes objects with names; everything below them is checked here before it is used, and
anything that cannot be a profile's value is refused with one line (StarterError) naming the
object and the field, quoting values only through short escaped excerpts. Each fact is marked
read (the objects say it) or guessed (a default, or a reading the maintainer must confirm).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hv_device_plugin.api.wire import CDI_DYNAMIC_DIR, CDI_STATIC_DIR, DEVICE_PLUGIN_DIR
from hvconform.contract import imageref
from hvconform.contract.profile_rules import HYPERVISOR_DEVICES
from hvconform.contract.safeyaml import excerpt

Obj = dict[str, Any]
# The host directories CDI specs are read from: containerd's and CRI-O's dynamic and static dirs.
CDI_DIRS = (CDI_DYNAMIC_DIR, "/run/cdi", CDI_STATIC_DIR)
HOST_DEV = "/dev"
# An HTTP probe path as a URL template may hold it: no space, quote or brace reaches the URL.
_URL_PATH = re.compile(r"/[A-Za-z0-9._~/%?&=+:@!$,;*-]{0,255}")
MAX_PORT = 65535


class StarterError(ValueError):
    """The objects cannot give a profile; one line naming where and why."""


@dataclass(frozen=True)
class Fact:
    value: Any
    read: bool  # True: the objects say it; False: a default or a guess to confirm
    note: str  # why this value, as the profile's comment says it


@dataclass(frozen=True)
class Facts:
    """One plugin DaemonSet's container, as a profile describes it."""

    daemonset: str
    name: Fact
    command: Fact
    env: Fact
    device_plugin_dir: Fact
    cdi_dir: Fact
    devices: Fact
    host_dev_dir: Fact | None
    readiness: Fact
    liveness: Fact
    image: Fact
    labels: Fact
    container: Fact
    skipped: list[str] = field(default_factory=list)  # what was seen and deliberately not used


def _mapping(value: Any, where: str) -> Obj:
    if not isinstance(value, dict):
        raise StarterError(f"{where}: want a mapping, got {excerpt(value)}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise StarterError(f"{where}: want a list, got {excerpt(value)}")
    return value


def _strings(value: Any, where: str) -> list[str]:
    out = _list(value, where)
    for i, item in enumerate(out):
        if not isinstance(item, str) or not item or "\x00" in item:
            raise StarterError(f"{where}[{i}]: want a non-empty string, got {excerpt(item)}")
    return out


def _name(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("name") or meta.get("generateName") or "")


def _abs(value: Any, where: str) -> str:
    """A normalised absolute path: a `..` or a doubled slash would make the profile's paths
    say something else than the objects once resolved (and the profile loader refuses it)."""
    if not isinstance(value, str) or "\x00" in value or "\n" in value:
        raise StarterError(f"{where}: want an absolute path, got {excerpt(value)}")
    path = value.rstrip("/") or "/"
    if not path.startswith("/") or path.startswith("//") or posixpath.normpath(path) != path:
        raise StarterError(
            f"{where}: {excerpt(value)} is not a normalised absolute path (no '.', '..' or "
            "doubled '/')"
        )
    return path


def _holds(host: str, path: str) -> bool:
    """`path` is `host` or inside it (a mount of /var/lib/kubelet holds the socket dir)."""
    return host == path or path.startswith(host.rstrip("/") + "/")


def _pod_spec(ds: Obj, where: str) -> Obj:
    spec = _mapping(ds.get("spec"), f"{where}.spec")
    template = _mapping(spec.get("template"), f"{where}.spec.template")
    return _mapping(template.get("spec"), f"{where}.spec.template.spec")


def _host_mounts(pod: Obj, container: Obj, where: str) -> list[tuple[str, str]]:
    """(host path, where the container sees it) of each hostPath volume the container mounts."""
    volumes: dict[str, str] = {}
    for i, vol in enumerate(_list(pod.get("volumes"), f"{where}.volumes")):
        vol = _mapping(vol, f"{where}.volumes[{i}]")
        host = vol.get("hostPath")
        if host is not None:
            path = _mapping(host, f"{where}.volumes[{i}].hostPath").get("path")
            volumes[str(vol.get("name"))] = _abs(path, f"{where}.volumes[{i}].hostPath.path")
    mounts: list[tuple[str, str]] = []
    at = f"{where}.containers[{container.get('name')}].volumeMounts"
    for i, mount in enumerate(_list(container.get("volumeMounts"), at)):
        mount = _mapping(mount, f"{at}[{i}]")
        host = volumes.get(str(mount.get("name")))
        if host is None:
            continue
        sub = mount.get("subPath")
        if sub:
            host = _abs(f"{host}/{sub}", f"{at}[{i}].subPath")
        mounts.append((host, _abs(mount.get("mountPath"), f"{at}[{i}].mountPath")))
    return mounts


def _mounts_any(ds: Obj, hosts: Sequence[str]) -> bool:
    try:
        pod = _pod_spec(ds, _name(ds))
        return any(
            host in hosts
            for c in _list(pod.get("containers"), "containers")
            if isinstance(c, dict)
            for host, _ in _host_mounts(pod, c, _name(ds))
        )
    except StarterError:
        return False  # a malformed one is reported when (and if) it is the one chosen


def _choose_daemonset(objects: list[Obj], where: str, wanted: str) -> Obj:
    sets = [o for o in objects if isinstance(o, dict) and o.get("kind") == "DaemonSet"]
    names = ", ".join(excerpt(_name(s)) for s in sets[:8])
    if wanted:
        sets = [s for s in sets if _name(s) == wanted]
        if not sets:
            raise StarterError(f"{where}: no DaemonSet named {excerpt(wanted)} (found: {names})")
    if not sets:
        raise StarterError(f"{where}: no DaemonSet (a device plugin is deployed as one)")
    if len(sets) > 1:
        # A plugin that writes CDI specs mounts the CDI dir; a helper (a bootstrap plugin,
        # a node labeller) does not.
        with_cdi = [s for s in sets if _mounts_any(s, CDI_DIRS)]
        sets = with_cdi if len(with_cdi) == 1 else sets
    if len(sets) > 1:
        raise StarterError(
            f"{where}: {len(sets)} DaemonSets ({names}): choose the plugin's with --daemonset NAME"
        )
    return sets[0]


def _choose_container(pod: Obj, where: str, wanted: str) -> Obj:
    containers = [
        _mapping(c, f"{where}.containers[{i}]")
        for i, c in enumerate(_list(pod.get("containers"), f"{where}.containers"))
    ]
    if not containers:
        raise StarterError(f"{where}: the DaemonSet has no containers")
    names = ", ".join(excerpt(c.get("name")) for c in containers[:8])
    if wanted:
        containers = [c for c in containers if c.get("name") == wanted]
        if not containers:
            raise StarterError(f"{where}: no container named {excerpt(wanted)} (found: {names})")
    if len(containers) > 1:
        # The plugin is the container that reaches the kubelet's socket dir.
        socket = [
            c
            for c in containers
            if any(_holds(h, DEVICE_PLUGIN_DIR) for h, _ in _host_mounts(pod, c, where))
        ]
        containers = socket if len(socket) == 1 else containers
    if len(containers) > 1:
        raise StarterError(
            f"{where}: {len(containers)} containers ({names}): choose the plugin's with "
            "--container NAME"
        )
    return containers[0]


def _port(value: Any, container: Obj, where: str) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 < value <= MAX_PORT:
            raise StarterError(f"{where}: {excerpt(value)} is not a port")
        return value
    for port in _list(container.get("ports"), f"{where} (container ports)"):
        if isinstance(port, dict) and port.get("name") == value:
            return _port(port.get("containerPort"), {}, f"{where} (port {excerpt(value)})")
    return None


def _probe(container: Obj, key: str, where: str) -> Fact:
    at = f"{where}.{key}"
    raw = container.get(key)
    if raw is None:
        return Fact({"type": "none"}, False, f"the container has no {key}: nothing to observe")
    probe = _mapping(raw, at)
    if "exec" in probe:
        command = _strings(_mapping(probe["exec"], f"{at}.exec").get("command"), f"{at}.exec")
        if not command:
            raise StarterError(f"{at}.exec.command: empty")
        return Fact({"type": "exec", "command": command}, True,
                    f"its {key}: run in the plugin's namespaces, exit 0 = healthy")  # fmt: skip
    if "httpGet" in probe:
        get = _mapping(probe["httpGet"], f"{at}.httpGet")
        if str(get.get("scheme", "HTTP")).upper() != "HTTP":
            return Fact({"type": "none"}, False, f"its {key} is HTTPS; the suite probes http only")
        port = _port(get.get("port"), container, f"{at}.httpGet.port")
        path = get.get("path") or "/"
        if not isinstance(path, str) or not _URL_PATH.fullmatch(path):
            raise StarterError(f"{at}.httpGet.path: {excerpt(path)} is not a URL path")
        if port is None:
            return Fact({"type": "none"}, False, f"its {key}'s port names no container port")
        return Fact({"type": "http", "url": f"http://{{health_host}}:{port}{path}"}, True,
                    f"its {key}'s httpGet, at the address the target gives the plugin")  # fmt: skip
    if "grpc" in probe:
        grpc = _mapping(probe["grpc"], f"{at}.grpc")
        service = grpc.get("service") or ""
        if not isinstance(service, str) or len(service) > 256 or "\x00" in service:
            raise StarterError(f"{at}.grpc.service: {excerpt(service)} is not a service name")
        return Fact({"type": "grpc-health", "service": service}, False,
                    f"its {key} is gRPC on a TCP port; the suite asks grpc.health.v1 on the "
                    "plugin's own socket instead: check the plugin serves it there")  # fmt: skip
    return Fact({"type": "none"}, False, f"its {key} has no profile equivalent (tcpSocket?)")


def _paths(mounts: list[tuple[str, str]], where: str) -> dict[str, Fact | None]:
    sockets = cdi = host_dev = None
    devices: list[str] = []
    for host, seen in mounts:
        if host == DEVICE_PLUGIN_DIR or (sockets is None and _holds(host, DEVICE_PLUGIN_DIR)):
            inside = posixpath.relpath(DEVICE_PLUGIN_DIR, host)
            sockets = seen if inside == "." else posixpath.join(seen, inside)
        elif host in CDI_DIRS:
            cdi = Fact(seen, True, f"the hostPath {host} is mounted here")
        elif host == HOST_DEV:
            host_dev = Fact(seen, True, "the host's /dev is mounted here (a host-device view)")
        elif host.startswith(HOST_DEV + "/"):
            if host not in HYPERVISOR_DEVICES:
                raise StarterError(
                    f"{where}: hostPath {excerpt(host)}: only {' and '.join(HYPERVISOR_DEVICES)} "
                    "are hypervisor devices this suite judges"
                )
            if host not in devices:
                devices.append(host)
    return {
        "device_plugin_dir": Fact(
            sockets, True, f"the hostPath {DEVICE_PLUGIN_DIR} is mounted here"
        )
        if sockets
        else Fact(DEVICE_PLUGIN_DIR, False, "no hostPath of the kubelet's socket dir: the default"),
        "cdi_dir": cdi
        or Fact(CDI_DYNAMIC_DIR, False, "no CDI hostPath mounted: the default (bound anyway)"),
        "devices": Fact(devices, True, "its hostPath devices")
        if devices
        else Fact(["/dev/kvm"], False, "no device hostPath: the default (/dev/kvm or /dev/mshv)"),
        "host_dev_dir": host_dev,
    }


def _env(container: Obj, where: str) -> tuple[dict[str, str], list[str]]:
    env: dict[str, str] = {}
    skipped: list[str] = []
    for i, item in enumerate(_list(container.get("env"), f"{where}.env")):
        item = _mapping(item, f"{where}.env[{i}]")
        name = item.get("name")
        if not isinstance(name, str):
            raise StarterError(f"{where}.env[{i}].name: want a string, got {excerpt(name)}")
        value = item.get("value", "")
        if "valueFrom" in item or not isinstance(value, str):
            skipped.append(f"env {name} (not a literal value)")
            continue
        env[name] = value
    return env, skipped


def _labels(ds: Obj, pod_template: Obj, where: str) -> dict[str, str]:
    selector = _mapping(ds["spec"].get("selector") or {}, f"{where}.spec.selector")
    labels = selector.get("matchLabels") or (pod_template.get("metadata") or {}).get("labels")
    if not isinstance(labels, dict) or not labels:
        raise StarterError(f"{where}: no spec.selector.matchLabels nor pod labels to find its pods")
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise StarterError(f"{where}: label {excerpt(key)} is not a string pair")
    return dict(labels)


def facts(
    objects: list[Obj], where: str, *, daemonset: str = "", container: str = "", image: str = ""
) -> Facts:
    """The facts of the plugin's DaemonSet among `objects` (from `where`); `image` replaces
    the container's (which must then be pinned, as a profile's deploy.image must be)."""
    ds = _choose_daemonset(objects, where, daemonset)
    ds_name = _name(ds)
    at = f"{where}: DaemonSet {ds_name}"
    pod = _pod_spec(ds, at)
    chosen = _choose_container(pod, at, container)
    c_name = chosen.get("name")
    if not isinstance(c_name, str):
        raise StarterError(f"{at}: a container without a name")
    c_at = f"{at}: container {c_name}"
    written = image or chosen.get("image")
    if not isinstance(written, str):
        raise StarterError(f"{c_at}.image: want an image reference, got {excerpt(written)}")
    problem = imageref.problem(written, pinned=True)
    if problem:
        raise StarterError(f"{c_at}.image: {problem} (give --image REF)")
    command = _strings(chosen.get("command"), f"{c_at}.command")
    args = _strings(chosen.get("args"), f"{c_at}.args")
    argv = [*command, *args] if command else [f"{{profile_dir}}/bin/{c_name}", *args]
    env, skipped = _env(chosen, c_at)
    paths = _paths(_host_mounts(pod, chosen, at), c_at)
    template = _mapping(ds["spec"]["template"], f"{at}.spec.template")
    return Facts(
        daemonset=ds_name,
        name=Fact(ds_name, True, "the DaemonSet's name"),
        command=Fact(argv, False, "the container's command and args"
                     + ("" if command else " (its image's entrypoint: named here)")
                     + "; point it at the plugin's binary on this machine"),
        env=Fact(env, True, "the container's literal env values"),
        device_plugin_dir=paths["device_plugin_dir"] or Fact(DEVICE_PLUGIN_DIR, False, ""),
        cdi_dir=paths["cdi_dir"] or Fact(CDI_DYNAMIC_DIR, False, ""),
        devices=paths["devices"] or Fact(["/dev/kvm"], False, ""),
        host_dev_dir=paths["host_dev_dir"],
        readiness=_probe(chosen, "readinessProbe", c_at),
        liveness=_probe(chosen, "livenessProbe", c_at),
        image=Fact(written, not image, "the container's image" if not image else "--image"),
        labels=Fact(_labels(ds, template, at), True, "the DaemonSet's pod selector"),
        container=Fact(c_name, True, "the plugin's container in those pods"),
        skipped=skipped,
    )  # fmt: skip
