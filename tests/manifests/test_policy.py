"""The security policy holds for every container of every render, and the checker is not blind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hvconform.manifests import RULES, check_policy
from tests.manifests.common import (
    ALL_TARGETS,
    DAEMONSETS,
    daemonset,
    every_container,
    objects,
    pod_spec,
)

ALLOWED_HOST_PATHS = {"/var/lib/kubelet/device-plugins", "/var/run/cdi", "/dev"}


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_checker_finds_no_violation(target: str) -> None:
    assert [str(v) for v in check_policy(objects(target))] == []


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_every_container_meets_the_policy_directly(target: str) -> None:
    """The same policy asserted field by field, independent of the checker's code."""
    objs = objects(target)
    seen = 0
    for where, c in every_container(objs):
        seen += 1
        sc = c["securityContext"]
        assert sc["capabilities"]["drop"] == ["ALL"], where
        assert not sc["capabilities"].get("add"), where
        assert sc["allowPrivilegeEscalation"] is False, where
        assert sc.get("privileged") is not True, where
        assert sc["readOnlyRootFilesystem"] is True, where
        assert sc["runAsUser"] == 0, where
        assert c["terminationMessagePath"] == "/tmp/termination-log", where
        assert c["terminationMessagePolicy"] == "FallbackToLogsOnError", where
        assert c["livenessProbe"]["exec"]["command"][:3] == [
            "hv-device-plugin",
            "probe",
            "liveness",
        ]
        assert c["readinessProbe"]["exec"]["command"][2] == "readiness", where
        for part in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][part]), where
        assert not c["image"].endswith(":latest"), where
    assert seen == 2
    for component in DAEMONSETS:
        pod = pod_spec(daemonset(objs, component))
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for field in ("hostNetwork", "hostPID", "hostIPC"):
            assert not pod.get(field), field
        volumes = {v["name"]: v for v in pod["volumes"]}
        host_paths = {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
        assert host_paths <= ALLOWED_HOST_PATHS
        assert volumes["tmp"]["emptyDir"] is not None
        for container in pod["containers"]:
            (dev,) = [m for m in container["volumeMounts"] if m["name"] == "host-dev"]
            assert dev["readOnly"] is True
            assert dev["mountPath"] == "/host-dev"
            assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}


# --- The meta-test: break one property at a time; the checker must name that rule. ---

Mutation = Callable[[dict[str, Any], dict[str, Any]], None]  # (pod spec, container)


def _host_dev_mount(c: dict[str, Any]) -> dict[str, Any]:
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/host-dev"]
    found: dict[str, Any] = mount
    return found


def _add_host_path(path: str) -> Mutation:
    def mutate(pod: dict[str, Any], c: dict[str, Any]) -> None:
        pod["volumes"].append({"name": "extra", "hostPath": {"path": path}})

    return mutate


def _init_container_without_security(pod: dict[str, Any], c: dict[str, Any]) -> None:
    init = {k: v for k, v in c.items() if k != "securityContext"}
    pod["initContainers"] = [{**init, "name": "init"}]


MUTATIONS: dict[str, tuple[Mutation, set[str]]] = {
    "drop capabilities.drop": (
        lambda p, c: c["securityContext"]["capabilities"].pop("drop"),
        {"caps-drop-all"},
    ),
    "drop capabilities": (lambda p, c: c["securityContext"].pop("capabilities"), {"caps-drop-all"}),
    "add a capability": (
        lambda p, c: c["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
        {"caps-no-add"},
    ),
    "drop allowPrivilegeEscalation": (
        lambda p, c: c["securityContext"].pop("allowPrivilegeEscalation"),
        {"no-privilege-escalation"},
    ),
    "allowPrivilegeEscalation true": (
        lambda p, c: c["securityContext"].update(allowPrivilegeEscalation=True),
        {"no-privilege-escalation"},
    ),
    "privileged true": (
        lambda p, c: c["securityContext"].update(privileged=True),
        {"not-privileged"},
    ),
    "drop pod seccompProfile": (
        lambda p, c: p["securityContext"].pop("seccompProfile"),
        {"seccomp-runtime-default"},
    ),
    "container seccomp Unconfined": (
        lambda p, c: c["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        {"seccomp-runtime-default"},
    ),
    "drop readOnlyRootFilesystem": (
        lambda p, c: c["securityContext"].pop("readOnlyRootFilesystem"),
        {"read-only-rootfs"},
    ),
    "drop automountServiceAccountToken": (
        lambda p, c: p.pop("automountServiceAccountToken"),
        {"no-sa-token"},
    ),
    "automountServiceAccountToken true": (
        lambda p, c: p.update(automountServiceAccountToken=True),
        {"no-sa-token"},
    ),
    "drop terminationMessagePath": (
        lambda p, c: c.pop("terminationMessagePath"),
        {"termination-message-path"},
    ),
    "terminationMessagePath in /dev": (
        lambda p, c: c.update(terminationMessagePath="/dev/termination-log"),
        {"termination-message-path"},
    ),
    "terminationMessagePath off the emptyDir": (
        lambda p, c: c.update(terminationMessagePath="/var/log/termination-log"),
        {"termination-message-path"},
    ),
    "drop terminationMessagePolicy": (
        lambda p, c: c.pop("terminationMessagePolicy"),
        {"termination-message-policy"},
    ),
    "drop livenessProbe": (lambda p, c: c.pop("livenessProbe"), {"probes"}),
    "drop readinessProbe": (lambda p, c: c.pop("readinessProbe"), {"probes"}),
    "drop requests.cpu": (lambda p, c: c["resources"]["requests"].pop("cpu"), {"resources"}),
    "drop requests.memory": (lambda p, c: c["resources"]["requests"].pop("memory"), {"resources"}),
    "drop limits.cpu": (lambda p, c: c["resources"]["limits"].pop("cpu"), {"resources"}),
    "drop limits.memory": (lambda p, c: c["resources"]["limits"].pop("memory"), {"resources"}),
    "drop resources": (lambda p, c: c.pop("resources"), {"resources"}),
    "hostPath /": (_add_host_path("/"), {"host-paths"}),
    "hostPath /etc": (_add_host_path("/etc"), {"host-paths"}),
    "hostPath escaping by ..": (_add_host_path("/var/run/cdi/../.."), {"host-paths"}),
    "hostPath /dev/kvm": (_add_host_path("/dev/kvm"), {"host-paths"}),
    "drop readOnly of the /dev view": (
        lambda p, c: _host_dev_mount(c).pop("readOnly"),
        {"host-dev-read-only"},
    ),
    "drop recursiveReadOnly of the /dev view": (
        lambda p, c: _host_dev_mount(c).pop("recursiveReadOnly"),
        {"host-dev-read-only"},
    ),
    "recursiveReadOnly Disabled": (
        lambda p, c: _host_dev_mount(c).update(recursiveReadOnly="Disabled"),
        {"host-dev-read-only"},
    ),
    "hostNetwork": (lambda p, c: p.update(hostNetwork=True), {"no-host-namespaces"}),
    "hostPID": (lambda p, c: p.update(hostPID=True), {"no-host-namespaces"}),
    "hostIPC": (lambda p, c: p.update(hostIPC=True), {"no-host-namespaces"}),
    "image :latest": (lambda p, c: c.update(image="hv-device-plugin:latest"), {"image-pinned"}),
    "image without a tag": (lambda p, c: c.update(image="hv-device-plugin"), {"image-pinned"}),
    "initContainer without securityContext": (
        _init_container_without_security,
        {
            "caps-drop-all",
            "no-privilege-escalation",
            "read-only-rootfs",
        },
    ),
}


@pytest.mark.parametrize("component", DAEMONSETS)
@pytest.mark.parametrize("target", ALL_TARGETS)
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_broken_property_is_reported(target: str, component: str, name: str) -> None:
    mutate, expected = MUTATIONS[name]
    objs = objects(target)
    ds = daemonset(objs, component)
    pod = pod_spec(ds)
    mutate(pod, pod["containers"][0])
    violations = check_policy(objs)
    assert {v.rule for v in violations} == expected, [str(v) for v in violations]
    assert all(v.where.startswith(f"DaemonSet/{ds['metadata']['name']}") for v in violations)


def test_every_rule_has_a_mutation_that_breaks_it() -> None:
    """A new rule without a mutation, or a rule nothing can trigger, fails here."""
    covered = {rule for _, rules in MUTATIONS.values() for rule in rules}
    assert covered | {"workloads-present"} == set(RULES)


def test_init_container_violations_name_the_init_container() -> None:
    objs = objects("kind")
    pod = pod_spec(daemonset(objs, "device-access"))
    _init_container_without_security(pod, pod["containers"][0])
    assert all("initContainers[init]" in v.where for v in check_policy(objs))


def test_restartable_init_container_needs_probes() -> None:
    objs = objects("kind")
    pod = pod_spec(daemonset(objs, "device-access"))
    sidecar = {k: v for k, v in pod["containers"][0].items() if not k.endswith("Probe")}
    pod["initContainers"] = [{**sidecar, "name": "sidecar", "restartPolicy": "Always"}]
    assert {v.rule for v in check_policy(objs)} == {"probes"}


def test_nothing_to_check_is_a_violation() -> None:
    namespace_only = [o for o in objects("kind") if o["kind"] == "Namespace"]
    assert [v.rule for v in check_policy(namespace_only)] == ["workloads-present"]
