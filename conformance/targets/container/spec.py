"""What `--runtime container` runs: the plugin container exactly as the profile's objects give it.

The profile's deploy section is rendered as the cluster targets render it (hvconform.manifests.
profile.render_deploy), for the target key "local" (a chart's `local` values, else its "*"), into
namespace hvconform, with the plugin image set to deploy.image. The DaemonSet whose pods carry
deploy.pods.labels and its container deploy.pods.container are what the engine runs:
- command and args as Entrypoint and Cmd, with Kubernetes' semantics (command replaces the
  image's entrypoint and drops its CMD; args alone replace the CMD) and $(VAR) references
  expanded from the container's env as the kubelet expands them;
- env: literal values; workingDir; runAsUser/runAsGroup (container, else pod); whether the root
  filesystem is read-only;
- volumeMounts: a hostPath mount must sit at one of the profile's paths (the node's plugin, CDI
  and host-device dirs are bound there, as LocalNode binds them for the sandbox, read-only when
  the mount is; the profile's devices are passed as devices); an emptyDir is a tmpfs;
- probes: exec probes are run in the container as evidence; an httpGet probe's port (else an
  `ADDR:PORT` argument, else the only containerPort) is where the profile's http probes go.
The harness's own hardening is fixed, as in the process runtime: every capability dropped,
no-new-privileges, no network. What cannot be honoured is refused before anything runs
(Unhonoured, one line naming the field): env from valueFrom/envFrom, volumes other than
hostPath and emptyDir, subPath, privileged, added capabilities, host namespaces.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from hvconform.contract.errors import Unhonoured
from hvconform.contract.plugin import PluginUnderTest, Probe
from hvconform.manifests.profile import plugin_workload, render_deploy
from hvconform.manifests.render import ManifestError

TARGET_KEY = "local"
NAMESPACE = "hvconform"
WHERE = "--runtime container"
DEFAULT_TMPFS = "size=16m,mode=1777"
_ADDR_ARG = re.compile(
    r"^(?:-{1,2}[A-Za-z0-9][-A-Za-z0-9_.]*=)?"
    r"(?:0\.0\.0\.0|127\.0\.0\.1|localhost|\[::\]|\[::1\]|)?:(?P<port>[0-9]{1,5})$"
)
_QUANTITY = re.compile(r"^(?P<n>[0-9]+)(?P<unit>Ki|Mi|Gi|k|M|G)?$")
_UNITS = {"": "", "Ki": "k", "k": "k", "Mi": "m", "M": "m", "Gi": "g", "G": "g"}


@dataclass(frozen=True)
class ContainerSpec:
    """The plugin container to create, and where each of its facts came from."""

    image: str
    entrypoint: tuple[str, ...] | None  # None: the image's ENTRYPOINT
    args: tuple[str, ...] | None  # None: the image's CMD (only when entrypoint is None)
    env: Mapping[str, str]
    working_dir: str = ""
    user: str = ""  # "uid[:gid]", "" for the image's
    read_only: bool = False
    tmpfs: Mapping[str, str] = field(default_factory=dict)  # mountPath -> options
    read_only_paths: frozenset[str] = frozenset()  # profile paths the objects mount readOnly
    health_port: int | None = None
    exec_probes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # kind -> argv
    workload: str = ""  # namespace/DaemonSet/container
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "entrypoint": None if self.entrypoint is None else list(self.entrypoint),
            "args": None if self.args is None else list(self.args),
            "env": dict(self.env),
            "working_dir": self.working_dir,
            "user": self.user,
            "read_only_rootfs": self.read_only,
            "tmpfs": dict(self.tmpfs),
            "read_only_paths": sorted(self.read_only_paths),
            "health_port": self.health_port,
            "exec_probes": {k: list(v) for k, v in self.exec_probes.items()},
            "workload": self.workload,
            "notes": list(self.notes),
        }


def expand(text: str, env: Mapping[str, str]) -> str:
    """The kubelet's $(VAR) expansion: a defined VAR is replaced, `$$` is a literal `$`, and
    anything else (an undefined VAR, a lone `$`) is left as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            end = text.find(")", i + 2) if text[i + 1] == "(" else -1
            if end != -1:
                name = text[i + 2 : end]
                out.append(env.get(name, text[i : end + 1]))
                i = end + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _refuse(field_: str, why: str) -> Unhonoured:
    return Unhonoured(f"{field_}: {why} ({WHERE})")


def _env(container: Mapping[str, Any], where: str) -> dict[str, str]:
    if container.get("envFrom"):
        raise _refuse(f"{where}.envFrom", "only literal env values can be given to the container")
    env: dict[str, str] = {}
    for i, item in enumerate(container.get("env") or []):
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name:
            raise _refuse(f"{where}.env[{i}]", "an env entry without a name")
        if "valueFrom" in item:
            raise _refuse(
                f"{where}.env[{i}] ({name}).valueFrom", "only literal values are honoured"
            )
        env[name] = expand(str(item.get("value", "")), env)
    return env


def _tmpfs_options(volume: Mapping[str, Any]) -> str:
    limit = str((volume.get("emptyDir") or {}).get("sizeLimit", ""))
    match = _QUANTITY.fullmatch(limit)
    if not match:
        return DEFAULT_TMPFS
    return f"size={match['n']}{_UNITS[match['unit'] or '']},mode=1777"


def _mounts(
    container: Mapping[str, Any], pod: Mapping[str, Any], plugin: PluginUnderTest, where: str
) -> tuple[dict[str, str], frozenset[str], list[str]]:
    """emptyDir tmpfs mounts, the profile paths mounted readOnly, and notes."""
    paths = plugin.paths
    allowed = {paths.device_plugin_dir, paths.cdi_dir, *paths.devices}
    allowed |= {paths.host_dev_dir} if paths.host_dev_dir else set()
    volumes = {v.get("name"): v for v in pod.get("volumes") or [] if isinstance(v, dict)}
    tmpfs: dict[str, str] = {}
    read_only: set[str] = set()
    mounted: set[str] = set()
    for i, mount in enumerate(container.get("volumeMounts") or []):
        at = f"{where}.volumeMounts[{i}]"
        target = str(mount.get("mountPath", ""))
        if mount.get("subPath") or mount.get("subPathExpr"):
            raise _refuse(f"{at}.subPath", "sub-path mounts are not honoured")
        volume = volumes.get(mount.get("name"))
        if volume is None:
            raise _refuse(f"{at}.name", f"no volume named {mount.get('name')!r:.60} in the pod")
        if "emptyDir" in volume:
            tmpfs[target] = _tmpfs_options(volume)
        elif "hostPath" in volume:
            if target not in allowed:
                raise _refuse(
                    at,
                    f"hostPath {volume['hostPath'].get('path')!r:.80} at {target!r:.80} is none of "
                    "the profile's paths (devicePluginDir, cdiDir, hostDevDir, devices): only "
                    "those are bound from the node",
                )
            mounted.add(target)
            if mount.get("readOnly"):
                read_only.add(target)
        else:
            kind = next((k for k in volume if k != "name"), "?")
            raise _refuse(
                f"{at} ({kind} volume)", "only hostPath and emptyDir volumes are honoured"
            )
    missing = sorted(p for p in allowed - mounted if p not in paths.devices)
    notes = [f"profile path {p} is not a mountPath of the plugin container" for p in missing]
    return tmpfs, frozenset(read_only), notes


def _privileges(container: Mapping[str, Any], pod: Mapping[str, Any], where: str) -> str:
    """Refuse what asks for more than the harness gives; the user to run as ("" = image's)."""
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            raise _refuse(
                f"spec.template.spec.{key}", "the plugin container gets no host namespace"
            )
    ctx = container.get("securityContext") or {}
    pod_ctx = pod.get("securityContext") or {}
    if ctx.get("privileged"):
        raise _refuse(f"{where}.securityContext.privileged", "the plugin runs unprivileged")
    added = (ctx.get("capabilities") or {}).get("add") or []
    if added:
        raise _refuse(
            f"{where}.securityContext.capabilities.add",
            f"{', '.join(map(str, added))[:80]}: the plugin runs with every capability dropped",
        )
    uid = ctx.get("runAsUser", pod_ctx.get("runAsUser"))
    gid = ctx.get("runAsGroup", pod_ctx.get("runAsGroup"))
    if uid is None:
        return "" if gid is None else f"0:{int(gid)}"
    return f"{int(uid)}" + ("" if gid is None else f":{int(gid)}")


def _port(value: Any, container: Mapping[str, Any]) -> int | None:
    if isinstance(value, int):
        return value
    for port in container.get("ports") or []:
        if isinstance(port, dict) and port.get("name") == value:
            return int(port["containerPort"])
    return int(value) if isinstance(value, str) and value.isdigit() else None


def health_port(container: Mapping[str, Any], argv: Sequence[str]) -> int | None:
    """Where the plugin serves HTTP health: an httpGet probe's port, else an ADDR:PORT (or
    --flag=ADDR:PORT) argument, else the container's only port."""
    for key in ("readinessProbe", "livenessProbe", "startupProbe"):
        http = (container.get(key) or {}).get("httpGet")
        if isinstance(http, dict) and (port := _port(http.get("port"), container)):
            return port
    for arg in argv:
        if match := _ADDR_ARG.fullmatch(arg):
            return int(match["port"])
    ports = [p for p in container.get("ports") or [] if isinstance(p, dict)]
    return int(ports[0]["containerPort"]) if len(ports) == 1 else None


def _check_http(probe: Probe, kind: str, port: int | None, plugin: PluginUnderTest) -> None:
    if probe.type != "http" or "{health_" not in probe.url:
        return
    if port is None:
        raise _refuse(
            f"{kind}.url",
            f"{probe.url!r:.80} needs the plugin's health port and its container names none "
            "(no httpGet probe, ADDR:PORT argument or single containerPort)",
        )
    url = urlsplit(plugin.fill(probe.url, f"127.0.0.1:{port}"))
    if url.scheme != "http" or not url.hostname:
        raise _refuse(f"{kind}.url", f"{probe.url!r:.80} is not an http URL")


def container_spec(plugin: PluginUnderTest) -> ContainerSpec:
    """The plugin container of `plugin`'s objects; Unhonoured (one line) when it cannot run as
    described. Pure: renders (helm template for a chart), creates nothing."""
    deploy = plugin.deploy
    if deploy is None:
        raise _refuse("deploy", f"plugin {plugin.name!r} has no deploy section (image, objects)")
    try:
        rendered = render_deploy(deploy, TARGET_KEY, namespace=NAMESPACE, image=deploy.image)
        workload, container = plugin_workload(rendered.objects, deploy)
    except ManifestError as exc:
        raise Unhonoured(f"deploy: {str(exc).splitlines()[0][:240]} ({WHERE})") from None
    pod: dict[str, Any] = workload["spec"]["template"]["spec"]
    name = str(container.get("name"))
    where = f"{workload['metadata']['name']}.containers[{name}]"
    if pod.get("initContainers"):
        raise _refuse(f"{where} initContainers", "only the plugin container is run")
    env = _env(container, where)
    command = [expand(str(a), env) for a in container.get("command") or []]
    args = [expand(str(a), env) for a in container.get("args") or []]
    user = _privileges(container, pod, where)
    tmpfs, read_only_paths, notes = _mounts(container, pod, plugin, where)
    port = health_port(container, [*command, *args])
    _check_http(plugin.readiness, "readiness", port, plugin)
    _check_http(plugin.liveness, "liveness", port, plugin)
    probes = {}
    for kind in ("readiness", "liveness", "startup"):
        argv = ((container.get(f"{kind}Probe") or {}).get("exec") or {}).get("command")
        if argv:
            probes[kind] = tuple(str(a) for a in argv)
    others = [c.get("name") for c in pod.get("containers", []) if c is not container]
    notes += [f"other container {o} of the pod is not run" for o in others]
    return ContainerSpec(
        image=rendered.image,
        entrypoint=tuple(command) if command else None,
        args=tuple(args) if (args or command) else None,
        env=env,
        working_dir=str(container.get("workingDir", "")),
        user=user,
        read_only=bool((container.get("securityContext") or {}).get("readOnlyRootFilesystem")),
        tmpfs=tmpfs,
        read_only_paths=read_only_paths,
        health_port=port,
        exec_probes=probes,
        workload=f"{NAMESPACE}/{workload['metadata']['name']}/{name}",
        notes=(*rendered.notes, *notes),
    )
