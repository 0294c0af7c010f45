"""The security policy on `helm template` output: the defaults and a matrix of non-default
values. Whatever an operator sets, no container gains a capability, leaves RuntimeDefault
seccomp, writes its root filesystem, gets a service-account token or loses its explicit
termination-log path; the args still parse as the plugin's own flags.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from hv_device_plugin.config import parse_config
from hvconform.manifests import check_policy
from tests.chart.helm import containers, daemonsets, template

DIGEST = "sha256:" + "d" * 64
MATRIX: dict[str, dict[str, Any]] = {
    "defaults": {},
    "mshv-pinned": {
        "hypervisor": "mshv",
        "image": {
            "repository": "myacr.azurecr.io/hv-device-plugin",
            "digest": DIGEST,
            "pullSecrets": ["acr-pull"],
        },
        "nodeSelector": {"kubernetes.io/arch": "amd64", "agentpool": "hvmshv"},
        "tolerations": [
            {"key": "sandbox", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
        ],
    },
    "no-metrics": {"metrics": {"enabled": False}},
    "service-monitor": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
            "service": {"annotations": {"example.com/team": "hv"}},
        },
    },
    "no-bootstrap": {"deviceAccess": {"enabled": False}},
    "tuned": {
        "slots": 16,
        "extraArgs": ["--log-level", "debug", "--probe-max-age=0"],
        "extraEnv": [{"name": "HV_RECHECK_INTERVAL", "value": "2.5"}],
        "resources": {
            "requests": {"cpu": "100m", "memory": "192Mi"},
            "limits": {"cpu": 1, "memory": "512Mi"},
        },
        "probes": {"liveness": {"periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 6}},
        "priorityClassName": "",
        "metrics": {"host": "[::]", "port": 10250},
    },
}


@pytest.fixture(scope="module", params=sorted(MATRIX))
def case(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    name: str = request.param
    return name, template(MATRIX[name])


def test_policy_checker_finds_nothing(case: tuple[str, list[dict[str, Any]]]) -> None:
    _, objs = case
    assert [str(v) for v in check_policy(objs)] == []


def test_policy_field_by_field(case: tuple[str, list[dict[str, Any]]]) -> None:
    name, objs = case
    sets = daemonsets(objs)
    assert set(sets) == (
        {"hypervisor-plugin"} if name == "no-bootstrap" else {"device-access", "hypervisor-plugin"}
    )
    for ds in sets.values():
        pod = ds["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not any(pod.get(f) for f in ("hostNetwork", "hostPID", "hostIPC"))
    for where, c in containers(objs):
        sc = c["securityContext"]
        assert sc["capabilities"] == {"drop": ["ALL"]}, where
        assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False, where
        assert sc["readOnlyRootFilesystem"] is True, where
        assert c["terminationMessagePath"] == "/tmp/termination-log", where
        assert c["terminationMessagePolicy"] == "FallbackToLogsOnError", where
        assert {"/tmp", "/host-dev"} <= {m["mountPath"] for m in c["volumeMounts"]}, where


def test_args_are_the_plugins_own_flags(case: tuple[str, list[dict[str, Any]]]) -> None:
    name, objs = case
    for component, c in containers(objs):
        cfg = parse_config(c["args"], environ={e["name"]: e["value"] for e in c.get("env", [])})
        assert cfg.mode == ("device-access" if component == "device-access" else "hypervisor")
        metrics = MATRIX[name].get("metrics", {})
        if metrics.get("enabled", True):
            host = str(metrics.get("host", "0.0.0.0")).strip("[]")  # noqa: S104
            assert cfg.health_addr == (host, metrics.get("port", 9400))
            assert c["ports"][0]["containerPort"] == metrics.get("port", 9400)
        else:
            assert "--health-addr" not in c["args"] and "ports" not in c
            assert cfg.health_addr[0] == "127.0.0.1"  # the plugin's loopback default
        if component == "hypervisor-plugin":
            assert cfg.slots == MATRIX[name].get("slots", 2000)


def test_objects_validate_against_kubernetes_1_37(case: tuple[str, list[dict[str, Any]]]) -> None:
    _, objs = case
    for obj in objs:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: no OpenAPI schema ships for it
        assert kubernetes_validate.validate(obj, "1.37", strict=True) == "1.37"


def test_non_default_values_land_where_they_belong() -> None:
    objs = template(MATRIX["mshv-pinned"])
    for ds in daemonsets(objs).values():
        pod = ds["spec"]["template"]["spec"]
        assert pod["imagePullSecrets"] == [{"name": "acr-pull"}]
        assert pod["nodeSelector"] == {"kubernetes.io/arch": "amd64", "agentpool": "hvmshv"}
        term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        exprs = {e["key"]: e["values"] for e in term["nodeSelectorTerms"][0]["matchExpressions"]}
        assert exprs == {"hyperlight.dev/hypervisor": ["mshv"], "kubernetes.io/arch": ["amd64"]}
        (c,) = pod["containers"]
        assert c["image"] == f"myacr.azurecr.io/hv-device-plugin@{DIGEST}"
        assert c["args"][c["args"].index("--hypervisor-device") + 1] == "/dev/mshv"
    tuned = template(MATRIX["tuned"])
    plugin = daemonsets(tuned)["hypervisor-plugin"]["spec"]["template"]["spec"]
    assert "priorityClassName" not in plugin
    (c,) = plugin["containers"]
    assert c["resources"]["limits"] == {
        "cpu": 1, "memory": "512Mi", "hyperlight.dev/device-access": "1"
    }  # fmt: skip
    assert c["livenessProbe"]["periodSeconds"] == 5
    assert c["args"][-3:] == ["--log-level", "debug", "--probe-max-age=0"]


def test_service_monitor_scrapes_the_metrics_service() -> None:
    objs = template(MATRIX["service-monitor"])
    (service,) = [o for o in objs if o["kind"] == "Service"]
    (monitor,) = [o for o in objs if o["kind"] == "ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s"}
    ]
    assert service["metadata"]["annotations"] == {"example.com/team": "hv"}
    assert all(
        o["kind"] not in ("Service", "ServiceMonitor") for o in template(MATRIX["no-metrics"])
    )
