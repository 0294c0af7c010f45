"""The security policy every workload in the rendered manifests must meet, as a checker."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from hvconform.manifests.render import CDI_DIR, PLUGIN_DIR, ManifestError, check_image

HOST_DEV: Final = "/dev"
ALLOWED_HOST_PATHS: Final = frozenset({PLUGIN_DIR, CDI_DIR, HOST_DEV})  # the standard ones
# Trees no plugin dir may be in (a distribution may move the kubelet root or the CDI dir, never
# into these).
SYSTEM_TREES: Final = ("/proc", "/sys", "/boot", "/usr", "/bin", "/sbin", "/lib", "/lib64")


def host_path_allowed(path: str) -> bool:
    """The node's /dev, a kubelet's plugin dir under any root (k0s, microk8s), or a CDI dir."""
    norm = posixpath.normpath(path)
    if ".." in path.split("/") or norm != path.rstrip("/") or not path.startswith("/"):
        return False
    if norm in ALLOWED_HOST_PATHS:
        return True
    if any(norm == t or norm.startswith(t + "/") for t in (*SYSTEM_TREES, "/dev", "/etc")):
        return norm == "/etc/cdi"  # the CDI static dir is the one place allowed under /etc
    if norm.endswith(("/device-plugins", "/cdi", "/plugins_registry")):
        return True
    # a kubelet plugin's own dir (<root>/plugins/<driver name>): a DRA driver's socket and state
    parent, name = posixpath.split(norm)
    return parent.endswith("/plugins") and bool(name) and name not in (".", "..")


# What a DRA driver needs from the API, and all a plugin's service account may be granted for
# its token to be mounted: read the claims it prepares, write ResourceSlices (its own node's
# only, by an admission policy RBAC cannot express).
DRA_DRIVER_RULES: Final = frozenset(
    {("resource.k8s.io", "resourceclaims", v) for v in ("get", "list", "watch")}
    | {("resource.k8s.io", "resourceslices", v)
       for v in ("get", "list", "watch", "create", "update", "patch", "delete")}
)  # fmt: skip


WORKLOAD_KINDS: Final = frozenset({"DaemonSet", "Deployment", "StatefulSet", "Job", "Pod"})

RULES: Final[Mapping[str, str]] = {
    "workloads-present": "at least one workload to check (an empty render passes nothing)",
    "caps-drop-all": "securityContext.capabilities.drop contains ALL",
    "caps-no-add": "securityContext.capabilities.add is absent or empty",
    "no-privilege-escalation": "securityContext.allowPrivilegeEscalation is false, explicitly",
    "not-privileged": "securityContext.privileged is not true",
    "seccomp-runtime-default": "seccompProfile RuntimeDefault (container level, else pod level)",
    "read-only-rootfs": "securityContext.readOnlyRootFilesystem is true",
    "no-sa-token": "pod automountServiceAccountToken is false, explicitly, unless its service "
    "account is granted nothing beyond a DRA driver's rules (claims read, ResourceSlices written)",
    "termination-message-path": "explicit terminationMessagePath on an emptyDir, outside /dev",
    "termination-message-policy": "explicit terminationMessagePolicy",
    "probes": "liveness and readiness probes on every long-running container",
    "resources": "cpu and memory in both requests and limits",
    "host-paths": "hostPath volumes only for a kubelet plugin dir (<root>/device-plugins, "
    "<root>/plugins_registry, <root>/plugins/<name>), a CDI dir (<dir>/cdi) and /dev, outside "
    "the system's own trees",
    "host-dev-read-only": "every mount of the /dev view is readOnly, recursively where possible",
    "no-host-namespaces": "no hostNetwork, hostPID or hostIPC",
    "image-pinned": "image pinned by a tag other than latest, or by a digest",
}


@dataclass(frozen=True)
class Violation:
    """One broken rule: which, where (kind/name and container), and what was found."""

    rule: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.where}: {self.detail}"


def _get(node: Any, *keys: str) -> Any:
    """Nested lookup that yields None for anything missing or not a mapping."""
    for key in keys:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _pod_spec(obj: Mapping[str, Any]) -> Any:
    if obj.get("kind") == "Pod":
        return obj.get("spec")
    return _get(obj, "spec", "template", "spec")


def _containers(pod: Any) -> Iterator[tuple[str, Mapping[str, Any], bool]]:
    """(label, container, long_running) for every container and initContainer."""
    for field in ("initContainers", "containers"):
        for index, container in enumerate(_get(pod, field) or []):
            name = _get(container, "name") or f"#{index}"
            # A restartable init container is a sidecar: it runs as long as the pod.
            long_running = field == "containers" or _get(container, "restartPolicy") == "Always"
            yield f"{field}[{name}]", container, long_running


def _granted(objects: list[Mapping[str, Any]]) -> dict[str, set[tuple[str, str, str]]]:
    """Service account name -> every (group, resource, verb) its bindings in `objects` grant
    ("*" for a wildcard); a binding to a role not in `objects` grants ("?", "?", "?")."""
    roles = {
        (o.get("kind"), _get(o, "metadata", "name")): o
        for o in objects
        if o.get("kind") in ("Role", "ClusterRole")
    }
    out: dict[str, set[tuple[str, str, str]]] = {}
    for binding in objects:
        if binding.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        role = roles.get((_get(binding, "roleRef", "kind"), _get(binding, "roleRef", "name")))
        rules: set[tuple[str, str, str]] = set()
        for rule in (_get(role, "rules") or []) if role else []:
            for g in _get(rule, "apiGroups") or [""]:
                for r in _get(rule, "resources") or ["*"]:
                    rules |= {(str(g), str(r), str(v)) for v in _get(rule, "verbs") or ["*"]}
        if role is None:
            rules.add(("?", "?", "?"))
        for subject in _get(binding, "subjects") or []:
            if _get(subject, "kind") == "ServiceAccount":
                out.setdefault(str(_get(subject, "name")), set()).update(rules)
    return out


class _Checker:
    def __init__(self, granted: Mapping[str, set[tuple[str, str, str]]] | None = None) -> None:
        self.violations: list[Violation] = []
        self.granted = granted or {}

    def fail(self, rule: str, where: str, detail: str) -> None:
        self.violations.append(Violation(rule, where, detail))

    def pod(self, where: str, pod: Any) -> None:
        if _get(pod, "automountServiceAccountToken") is not False:
            found = _get(pod, "automountServiceAccountToken")
            account = str(_get(pod, "serviceAccountName") or "default")
            extra = sorted(self.granted.get(account, {("?", "?", "?")}) - DRA_DRIVER_RULES)
            if account == "default" or extra:
                beyond = f" (service account {account!r} may also {extra[:3]})" if extra else ""
                self.fail(
                    "no-sa-token", where, f"automountServiceAccountToken is {found!r}{beyond}"
                )
        for field in ("hostNetwork", "hostPID", "hostIPC"):
            if _get(pod, field) is True:
                self.fail("no-host-namespaces", where, f"{field} is true")
        volumes = {_get(v, "name"): v for v in _get(pod, "volumes") or []}
        for name, volume in volumes.items():
            path = _get(volume, "hostPath", "path")
            if path is None:
                continue
            if not host_path_allowed(str(path)):
                self.fail("host-paths", where, f"volume {name!r} mounts host path {path!r}")
        for label, container, long_running in _containers(pod):
            self.container(f"{where} {label}", pod, container, volumes, long_running)

    def container(
        self,
        where: str,
        pod: Any,
        container: Mapping[str, Any],
        volumes: Mapping[Any, Any],
        long_running: bool,
    ) -> None:
        sc = _get(container, "securityContext")
        if "ALL" not in (_get(sc, "capabilities", "drop") or []):
            self.fail("caps-drop-all", where, "capabilities.drop lacks ALL")
        if _get(sc, "capabilities", "add"):
            self.fail("caps-no-add", where, f"capabilities.add {_get(sc, 'capabilities', 'add')}")
        if _get(sc, "allowPrivilegeEscalation") is not False:
            found = _get(sc, "allowPrivilegeEscalation")
            self.fail("no-privilege-escalation", where, f"allowPrivilegeEscalation is {found!r}")
        if _get(sc, "privileged") is True:
            self.fail("not-privileged", where, "privileged is true")
        seccomp = _get(sc, "seccompProfile", "type") or _get(
            pod, "securityContext", "seccompProfile", "type"
        )
        if seccomp != "RuntimeDefault":
            self.fail("seccomp-runtime-default", where, f"effective seccomp type is {seccomp!r}")
        if _get(sc, "readOnlyRootFilesystem") is not True:
            found = _get(sc, "readOnlyRootFilesystem")
            self.fail("read-only-rootfs", where, f"readOnlyRootFilesystem is {found!r}")
        self.termination(where, container, volumes)
        if long_running:
            for probe in ("livenessProbe", "readinessProbe"):
                if not _get(container, probe):
                    self.fail("probes", where, f"no {probe}")
        for part in ("requests", "limits"):
            missing = [
                r for r in ("cpu", "memory") if _get(container, "resources", part, r) is None
            ]
            if missing:
                self.fail("resources", where, f"resources.{part} lacks {', '.join(missing)}")
        for mount in _get(container, "volumeMounts") or []:
            path = _get(volumes.get(_get(mount, "name")), "hostPath", "path")
            if path is None or posixpath.normpath(path) != HOST_DEV:
                continue
            rro = _get(mount, "recursiveReadOnly")
            if _get(mount, "readOnly") is not True or rro not in ("Enabled", "IfPossible"):
                self.fail(
                    "host-dev-read-only",
                    where,
                    f"mount at {_get(mount, 'mountPath')!r}: readOnly "
                    f"{_get(mount, 'readOnly')!r}, recursiveReadOnly {rro!r}",
                )
        try:
            check_image(str(_get(container, "image") or ""))
        except ManifestError as exc:
            self.fail("image-pinned", where, str(exc))

    def termination(
        self, where: str, container: Mapping[str, Any], volumes: Mapping[Any, Any]
    ) -> None:
        path = _get(container, "terminationMessagePath")
        writable = {
            posixpath.normpath(str(_get(m, "mountPath")))
            for m in _get(container, "volumeMounts") or []
            if _get(volumes.get(_get(m, "name")), "emptyDir") is not None
        }
        if not isinstance(path, str) or not posixpath.isabs(path):
            self.fail("termination-message-path", where, f"terminationMessagePath is {path!r}")
        elif posixpath.normpath(path).startswith(HOST_DEV + "/"):
            self.fail("termination-message-path", where, f"{path!r} is under /dev")
        elif posixpath.dirname(posixpath.normpath(path)) not in writable:
            self.fail("termination-message-path", where, f"{path!r} is not on an emptyDir mount")
        if not _get(container, "terminationMessagePolicy"):
            self.fail("termination-message-policy", where, "no explicit terminationMessagePolicy")


def check_policy(objects: Iterable[Mapping[str, Any]]) -> list[Violation]:
    """Every violation of RULES in `objects`; an empty list means the manifests comply."""
    objects = list(objects)
    checker = _Checker(_granted(objects))
    workloads = 0
    for obj in objects:
        if obj.get("kind") not in WORKLOAD_KINDS:
            continue
        workloads += 1
        checker.pod(f"{obj.get('kind')}/{_get(obj, 'metadata', 'name')}", _pod_spec(obj))
    if workloads == 0:
        checker.fail("workloads-present", "manifests", "no workload found")
    return checker.violations
