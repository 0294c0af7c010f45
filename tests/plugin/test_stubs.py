"""The committed stubs (device plugin v1beta1, DRA v1, plugin registration) are exactly what
their .protos generate today, and their method paths are the kubelet's."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def test_committed_stubs_match_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is a dev dependency")
    from tools.gen_protos import generate

    fresh_dir = generate(tmp_path)
    stems = ("deviceplugin", "dra", "drahealth", "pluginregistration")
    for name in (f"{s}{suffix}" for s in stems for suffix in SUFFIXES):
        fresh = (fresh_dir / name).read_bytes()
        assert fresh == (ROOT / "plugin" / "api" / name).read_bytes(), f"{name} is stale"


def test_method_paths_are_the_kubelet_wire_contract() -> None:
    from hv_device_plugin.api import deviceplugin_pb2 as pb

    services = {
        s.full_name: [m.name for m in s.methods] for s in pb.DESCRIPTOR.services_by_name.values()
    }
    assert services == {
        "v1beta1.Registration": ["Register"],
        "v1beta1.DevicePlugin": [
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        ],
    }
    fields = {f.name: f.number for f in pb.ContainerAllocateResponse.DESCRIPTOR.fields}
    assert fields == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}


def test_dra_and_registration_paths_are_the_kubelet_wire_contract() -> None:
    """What the v1.37.2 kubelet dials: /k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/<method> on the
    driver's endpoint and /pluginregistration.Registration/<method> on its registry socket."""
    from hv_device_plugin.api import dra_pb2, pluginregistration_pb2
    from hv_device_plugin.api.dra_wire import DRA_SERVICE_V1

    dra = {
        s.full_name: [m.name for m in s.methods]
        for s in dra_pb2.DESCRIPTOR.services_by_name.values()
    }
    assert dra == {
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin": [
            "NodePrepareResources",
            "NodeUnprepareResources",
        ]
    }
    assert DRA_SERVICE_V1 == "v1." + "DRAPlugin"  # the package's last element and the service
    reg = pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"]
    assert reg.full_name == "pluginregistration.Registration"
    assert [m.name for m in reg.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    device = {f.name: f.number for f in dra_pb2.Device.DESCRIPTOR.fields}
    assert device == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    claim = {f.name: f.number for f in dra_pb2.Claim.DESCRIPTOR.fields}
    assert claim == {"namespace": 1, "uid": 2, "name": 3}
    info = {f.name: f.number for f in pluginregistration_pb2.PluginInfo.DESCRIPTOR.fields}
    assert info == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}


def test_dra_health_path_is_the_kubelet_wire_contract() -> None:
    from hv_device_plugin.api import drahealth_pb2
    from hv_device_plugin.api.dra_wire import DRA_HEALTH_SERVICE_V1

    (service,) = drahealth_pb2.DESCRIPTOR.services_by_name.values()
    assert service.full_name == DRA_HEALTH_SERVICE_V1 == "v1.DRAResourceHealth"
    assert [m.name for m in service.methods] == ["NodeWatchResources"]
    fields = {f.name: f.number for f in drahealth_pb2.DeviceHealth.DESCRIPTOR.fields}
    assert fields == {"device": 1, "health": 2, "last_updated_time": 3,
                      "health_check_timeout_seconds": 4, "message": 5}  # fmt: skip
    assert dict(drahealth_pb2.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
