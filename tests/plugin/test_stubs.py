"""The committed v1beta1 stubs are exactly what the .proto generates today."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_match_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is a dev dependency")
    from tools.gen_protos import generate

    generate(tmp_path)
    for name in (
        "deviceplugin_pb2.py",
        "deviceplugin_pb2.pyi",
        "deviceplugin_pb2_grpc.py",
        "deviceplugin_pb2_grpc.pyi",
    ):
        fresh = (tmp_path / "plugin" / "api" / name).read_bytes()
        assert fresh == (ROOT / "plugin" / "api" / name).read_bytes(), f"{name} is stale"


def test_method_paths_are_the_kubelet_wire_contract() -> None:
    from plugin.api import deviceplugin_pb2 as pb

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
