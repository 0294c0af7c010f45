"""The blast radius of a profile's objects on a cluster the user owns: what a run may apply.

A profile describes how a plugin deploys; the suite applies it on clusters that belong to people
(an existing cluster, AKS). By default a profile may deploy namespaced objects (moved into the
run's namespace) and the few cluster-scoped kinds a device plugin or a DRA driver needs, each
bounded to what such a plugin needs: its own ClusterRoles (no wildcard, no escalate/bind/
impersonate), bindings of those roles to its own ServiceAccounts, a DeviceClass, a RuntimeClass,
and ValidatingAdmissionPolicies that only watch the DRA API (resource.k8s.io). Anything wider is
refused with one line naming the object, unless the user names that object with
`--allow-object KIND/NAME`: a binding to a built-in role or to users and groups, webhooks, CRDs,
APIServices, any other cluster-scoped kind, hostPID/hostNetwork/hostIPC pods and hostPath
mounts of the host's root or its system trees. A profile's Namespace object is never applied:
the run's own namespace replaces it, so no run creates or deletes a namespace it did not make
(kube-system, default, anyone's). The suite's own objects are not the profile's and are listed
apart (SUITE_OBJECTS).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
Namespaced = Callable[[str, str], bool]  # (apiVersion, kind) -> the kind lives in a namespace

# The cluster-scoped kinds a plugin or driver may bring without an opt-in (each further bounded
# by the rules below), and the API groups whose objects they serve.
DEFAULT_CLUSTER_KINDS = frozenset(
    {"ClusterRole", "ClusterRoleBinding", "DeviceClass", "RuntimeClass",
     "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
)  # fmt: skip
DRA_GROUP = "resource.k8s.io"
WORKLOAD_KINDS = frozenset(
    {"Pod", "DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job", "CronJob"}
)
# hostPath mounts that hand a pod the host itself (its root, configuration, users' and system
# trees): a plugin needs /dev, the kubelet's plugin dirs and the CDI dir, never these.
HOST_ROOTS = frozenset(
    {"/", "/etc", "/root", "/home", "/boot", "/usr", "/var", "/var/lib", "/proc", "/lib",
     "/bin", "/sbin", "/opt", "/srv", "/var/lib/kubelet", "/etc/kubernetes"}
)  # fmt: skip
_RBAC_WIDE_VERBS = frozenset({"*", "escalate", "bind", "impersonate"})

# The suite's own objects on a cluster (never a profile's, never an opt-in): declared here once
# and printed in every plan beside the profile's.
SUITE_OBJECTS = (
    "Namespace <plugin namespace>: the run's own, replacing any Namespace of the profile",
    "Namespace <work namespace>: the run's workload pods (pod-security restricted)",
    "Pod guests in the work namespace: the counting guest, one device each",
    "Pod diagnostic (--node-access pod): privileged, hostPID, nsenter into the node",
)


class Refused(ValueError):
    """An object wider than the run may apply: one line naming it and the opt-in."""


@dataclass
class Gated:
    """The objects a run applies, and what the plan and the report say about them."""

    objects: list[Obj]
    cluster_scoped: list[str] = field(default_factory=list)  # "Kind name", each one
    opted_in: list[str] = field(default_factory=list)  # "Kind/name: why it needed the opt-in"
    notes: list[str] = field(default_factory=list)
    # the pod-security labels of the profile's Namespace objects, which the run's namespace
    # carries in their place (its pods' admission level, inside the run's own namespace only)
    namespace_labels: dict[str, str] = field(default_factory=dict)


POD_SECURITY = "pod-security.kubernetes.io/"


def object_key(obj: Obj) -> str:
    """How --allow-object names an object: Kind/name, or Kind/generateName for a generated one."""
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{meta.get('name') or meta.get('generateName') or ''}"


def _named(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    name = meta.get("name") or f"{meta.get('generateName', '')}<generated>"
    return f"{obj.get('kind')} {name}"


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def _pod_spec(obj: Obj) -> Obj | None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return None
    if obj.get("kind") == "Pod":
        return spec
    if obj.get("kind") == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
    inner = (spec.get("template") or {}).get("spec")
    return inner if isinstance(inner, dict) else None


def _host_access(obj: Obj) -> list[str]:
    """What of the host a workload's pods get that a device plugin never needs."""
    spec = _pod_spec(obj)
    if spec is None:
        return []
    wide = [f"{k}: true" for k in ("hostPID", "hostNetwork", "hostIPC") if spec.get(k) is True]
    for volume in spec.get("volumes") or []:
        path = ((volume or {}).get("hostPath") or {}).get("path")
        if isinstance(path, str):
            normal = posixpath.normpath("/" + path.strip()) if path.strip() else "/"
            if normal.startswith("//"):
                normal = "/" + normal.lstrip("/")
            if normal in HOST_ROOTS:
                wide.append(f"hostPath {path!r:.80}")
    return wide


def _role_problems(obj: Obj) -> list[str]:
    problems = []
    for rule in obj.get("rules") or []:
        rule = rule or {}
        verbs = set(rule.get("verbs") or [])
        if verbs & _RBAC_WIDE_VERBS:
            problems.append(f"verbs {sorted(verbs & _RBAC_WIDE_VERBS)}")
        if "*" in (rule.get("resources") or []) or "*" in (rule.get("apiGroups") or []):
            problems.append("a wildcard resource or API group")
        if rule.get("nonResourceURLs"):
            problems.append("nonResourceURLs")
    if obj.get("aggregationRule"):
        problems.append("an aggregationRule")
    return problems


def _binding_problems(obj: Obj, roles: set[tuple[str, str]], namespace: str) -> list[str]:
    problems = []
    ref = obj.get("roleRef") or {}
    if (str(ref.get("kind")), str(ref.get("name"))) not in roles:
        problems.append(
            f"binds {ref.get('kind')} {ref.get('name')!r:.60}, not a role of the profile's own"
        )
    for subject in obj.get("subjects") or []:
        subject = subject or {}
        if subject.get("kind") != "ServiceAccount":
            problems.append(f"binds {subject.get('kind')} {subject.get('name')!r:.60}")
        elif subject.get("namespace", namespace) != namespace:
            problems.append(f"binds a ServiceAccount of namespace {subject.get('namespace')!r:.60}")
    return problems


def _policy_problems(obj: Obj, policies: set[str]) -> list[str]:
    if obj["kind"] == "ValidatingAdmissionPolicyBinding":
        name = (obj.get("spec") or {}).get("policyName")
        return [] if name in policies else [f"binds policy {name!r:.60}, not the profile's own"]
    rules = ((obj.get("spec") or {}).get("matchConstraints") or {}).get("resourceRules") or []
    groups = {g for r in rules for g in ((r or {}).get("apiGroups") or ["*"])}
    if not rules or groups - {DRA_GROUP}:
        return [f"watches API groups {sorted(groups) or ['*']} (a driver's policy watches only "
                f"{DRA_GROUP})"]  # fmt: skip
    return []


def _move_subjects(obj: Obj, namespace: str) -> int:
    """A binding's ServiceAccounts follow their objects into the run's namespace."""
    moved = 0
    for subject in obj.get("subjects") or []:
        is_account = isinstance(subject, dict) and subject.get("kind") == "ServiceAccount"
        if is_account and subject.get("namespace") != namespace:
            subject["namespace"] = namespace
            moved += 1
    return moved


def gate(
    objects: Iterable[Obj],
    *,
    namespace: str,
    allowed: Iterable[str] = (),
    namespaced: Namespaced,
) -> Gated:
    """The objects a run may apply in `namespace`; Refused for the first one wider than the
    defaults and not named in `allowed` (Kind/name). Unused opt-ins are refused too: a typo must
    not leave the user believing something was allowed."""
    allow = set(allowed)
    used: set[str] = set()
    result = Gated([])
    objects = list(objects)
    replaced = [o for o in objects if o.get("kind") == "Namespace"]
    kept = [o for o in objects if o.get("kind") != "Namespace"]
    for obj in replaced:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        result.namespace_labels.update(
            {k: str(v) for k, v in labels.items() if str(k).startswith(POD_SECURITY)}
        )
    if replaced:
        carried = ", ".join(f"{k}={v}" for k, v in sorted(result.namespace_labels.items()))
        result.notes.append(
            f"override: the profile's {', '.join(_named(o) for o in replaced)} replaced by the "
            f"run's namespace {namespace} (a run never creates nor deletes a namespace it did "
            f"not make){'; its labels kept: ' + carried if carried else ''}"
        )
    roles = {(o["kind"], o["metadata"].get("name")) for o in kept
             if o["kind"] in ("ClusterRole", "Role")}  # fmt: skip
    policies = {o["metadata"].get("name") for o in kept if o["kind"] == "ValidatingAdmissionPolicy"}
    moved = 0
    for obj in kept:
        scoped = namespaced(obj["apiVersion"], obj["kind"])
        kind = obj["kind"]
        why: list[str] = []
        if not scoped:
            result.cluster_scoped.append(_named(obj))
            if kind not in DEFAULT_CLUSTER_KINDS:
                why.append(f"cluster-scoped {kind} is not one a device plugin needs")
            elif kind == "ClusterRole":
                why += _role_problems(obj)
            elif kind == "ClusterRoleBinding":
                moved += _move_subjects(obj, namespace)
                why += _binding_problems(obj, roles, namespace)
            elif kind.startswith("ValidatingAdmissionPolicy"):
                why += _policy_problems(obj, policies)
        elif kind in ("RoleBinding",):
            moved += _move_subjects(obj, namespace)
            why += _binding_problems(obj, roles, namespace)
        elif kind == "Role":
            why += _role_problems(obj)
        if kind in WORKLOAD_KINDS:
            why += _host_access(obj)
        if not why:
            result.objects.append(obj)
            continue
        key = object_key(obj)
        if key not in allow:
            raise Refused(
                f"{_named(obj)!r:.120} is wider than a plugin's deploy ({'; '.join(why)[:200]}): "
                f"refused; to apply it anyway, name it: --allow-object {key!r:.120}"
            )
        used.add(key)
        result.opted_in.append(f"{key}: {'; '.join(why)[:200]}")
        result.objects.append(obj)
    unused = sorted(allow - used)
    if unused:
        raise Refused(
            f"--allow-object {unused[0]!r:.120} names no object of the profile that needs it "
            "(Kind/name as the profile writes it, or Kind/generateName)"
        )
    if moved:
        result.notes.append(
            f"override: {moved} binding subject(s) moved to the run's namespace {namespace}"
        )
    return result
