"""The chart's DRA mode (issue 28): `mode: dra` renders the DRA driver, its DeviceClass, its API
access and nothing of the device plugin's own; every object is valid Kubernetes 1.37; the
policy holds (the driver's token is allowed only because its account is granted nothing beyond
a DRA driver's rules, which the checker verifies, and a wider grant is caught).
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate

from hv_device_plugin.api.dra_wire import PLUGINS_DIR, PLUGINS_REGISTRY_DIR
from hv_device_plugin.api.names import DRA_DRIVER, HYPERVISOR_RESOURCE
from hv_device_plugin.config import parse_config
from hvconform.manifests import check_policy
from tests.chart.helm import containers, template

DRA = {"mode": "dra"}


def _by_kind(objs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for obj in objs:
        out.setdefault(obj["kind"], []).append(obj)
    return out


def test_dra_mode_renders_the_driver_and_its_class_and_no_device_plugin() -> None:
    objs = template(DRA)
    kinds = _by_kind(objs)
    names = sorted(d["metadata"]["name"] for d in kinds["DaemonSet"])
    assert names == ["hv-device-access-kvm", "hv-dra-driver-kvm"]
    (klass,) = kinds["DeviceClass"]
    assert klass["metadata"]["name"] == DRA_DRIVER
    assert klass["spec"]["extendedResourceName"] == HYPERVISOR_RESOURCE
    assert klass["spec"]["selectors"] == [
        {"cel": {"expression": f'device.driver == "{DRA_DRIVER}"'}}
    ]
    (role,) = kinds["ClusterRole"]
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {
        ("resourceclaims", "get"),
        *{("resourceslices", v) for v in ("get", "create", "update", "delete")},
    }
    assert "ValidatingAdmissionPolicy" in kinds and "ValidatingAdmissionPolicyBinding" in kinds
    for obj in objs:
        assert kubernetes_validate.validate(obj, "1.37", strict=True) == "1.37", obj["kind"]
    assert check_policy(objs) == []
    assert "DeviceClass" not in _by_kind(template())  # the default renders no DRA object


def test_the_driver_args_parse_as_the_plugins_own_dra_flags() -> None:
    objs = template(DRA)
    (driver,) = [c for component, c in containers(objs) if component == "dra-driver"]
    assert {"name": "HV_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in (
        driver["env"]
    )
    cfg = parse_config(driver["args"], {"HV_NODE_NAME": "node-a"})
    assert cfg.mode == "dra" and cfg.dra is not None and cfg.dra.node_name == "node-a"
    assert str(cfg.dra.plugins_registry_dir) == PLUGINS_REGISTRY_DIR
    assert str(cfg.dra.plugin_dir) == f"{PLUGINS_DIR}/{DRA_DRIVER}"
    mounts = {m["mountPath"] for m in driver["volumeMounts"]}
    # at the host's own paths: the kubelet dials the endpoint the driver names
    assert {PLUGINS_REGISTRY_DIR, f"{PLUGINS_DIR}/{DRA_DRIVER}"} <= mounts
    probe = driver["readinessProbe"]["exec"]["command"]
    assert probe[-2:] == ["--dra-plugin-dir", f"{PLUGINS_DIR}/{DRA_DRIVER}"]


def test_another_kubelet_root_and_driver_name_move_every_path() -> None:
    objs = template({**DRA, "kubeletRootDir": "/var/snap/k/var/lib/kubelet",
                     "dra": {"driverName": "kvm.example.com", "nodeRestriction": False,
                             "deviceClass": {"create": True, "extendedResourceName": ""}}})  # fmt: skip
    kinds = _by_kind(objs)
    (driver,) = [c for component, c in containers(objs) if component == "dra-driver"]
    cfg = parse_config(driver["args"], {"HV_NODE_NAME": "n"})
    assert cfg.dra is not None and cfg.dra.driver_name == "kvm.example.com"
    assert str(cfg.dra.plugin_dir) == "/var/snap/k/var/lib/kubelet/plugins/kvm.example.com"
    assert "extendedResourceName" not in kinds["DeviceClass"][0]["spec"]
    assert "ValidatingAdmissionPolicy" not in kinds


def test_a_wider_grant_takes_the_token_away() -> None:
    objs = template(DRA)
    wider = copy.deepcopy(objs)
    for obj in wider:
        if obj["kind"] == "ClusterRole":
            obj["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})
    found = [v for v in check_policy(wider) if v.rule == "no-sa-token"]
    assert found and "secrets" in found[0].detail
    unbound = [o for o in objs if o["kind"] != "ClusterRoleBinding"]
    assert [v.rule for v in check_policy(unbound)] == ["no-sa-token"]


def test_the_plugin_dirs_a_dra_driver_may_mount() -> None:
    from hvconform.manifests.policy import host_path_allowed

    for good in ("/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/kvm.example.com",
                 "/var/snap/microk8s/common/var/lib/kubelet/plugins/d"):  # fmt: skip
        assert host_path_allowed(good), good
    for bad in ("/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins/..", "/etc/plugins/x",
                "/var/lib/kubelet/plugins/a/../../..", "/proc/plugins/x", "/var/lib/kubelet"):  # fmt: skip
        assert not host_path_allowed(bad), bad
