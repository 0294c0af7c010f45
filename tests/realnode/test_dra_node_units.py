"""The node target's DRA faults and observations that need no running node: the driver's
registration socket told from the others of the kubelet's plugins_registry by GetInfo (any
name), and the kubelet's failed unprepares of a pod read from its log lines."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from hv_device_plugin.api import pluginregistration_pb2 as reg_pb
from hv_device_plugin.api import pluginregistration_pb2_grpc as reg_grpc
from hvconform.contract.dra import unprepare_failed
from hvconform.targets.realnode import procs
from hvconform.targets.realnode.dra_node import RealDraNode

DRIVER = "hypervisor.hyperlight.dev"
# as the v1.37.2 kubelet logs a failed NodeUnprepareResources (pod_workers.go)
FAILED = (
    'E0101 10:00:00.000000    4242 pod_workers.go:1338] "Error syncing pod, skipping" '
    'err="unprepare dynamic resources: NodeUnprepareResources failed for ResourceClaim '
    'hv-pod-1-extended-resources-x: /var/run/cdi/x.json: Read-only file system" '
    'pod="hv-conformance/hv-pod-1" podUID="0b4d"'
)


class _Info(reg_grpc.RegistrationServicer):
    def __init__(self, name: str) -> None:
        self.name = name

    def GetInfo(self, request: reg_pb.InfoRequest, context: Any) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(type="DRAPlugin", name=self.name, endpoint="/x/dra.sock")


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Path]:
    """A plugins_registry with another driver's socket, a socket nothing serves, and a file."""
    servers = []
    for sock, name in (("a-other.sock", "other.example.com"), ("zz-ours.sock", DRIVER)):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
        reg_grpc.add_RegistrationServicer_to_server(_Info(name), server)
        server.add_insecure_port(f"unix://{tmp_path / sock}")
        server.start()
        servers.append(server)
    stale = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    stale.add_insecure_port(f"unix://{tmp_path / 'b-stale.sock'}")
    stale.start()
    stale.stop(None)  # its socket file stays, nothing answers
    (tmp_path / "notes.txt").write_text("not a socket")
    yield tmp_path
    for server in servers:
        server.stop(None)


def _node(registry: Path) -> RealDraNode:
    node = RealDraNode.__new__(RealDraNode)
    node._registry = registry
    node.dra = SimpleNamespace(driver=DRIVER)  # type: ignore[assignment]
    node._socket_removed = False
    node._faults = set()
    node.touched = lambda: None  # type: ignore[method-assign]
    return node


def test_the_drivers_registration_socket_is_the_one_whose_getinfo_names_it(registry: Path) -> None:
    node = _node(registry)
    assert node._registration_socket() == registry / "zz-ours.sock"
    node.remove_registration_socket()
    assert not (registry / "zz-ours.sock").exists() and (registry / "a-other.sock").exists()
    assert node._socket_removed  # the restore looks for it again
    assert node._registration_socket() is None
    with pytest.raises(AssertionError, match="answers GetInfo"):
        node.remove_registration_socket()


def test_failed_unprepares_are_the_kubelets_lines_naming_the_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    other = FAILED.replace("hv-pod-1", "hv-pod-12")
    prepare = FAILED.replace("unprepare dynamic resources", "prepare dynamic resources")
    log = "\n".join([FAILED, other, prepare, FAILED.replace("E0101", "E0102")])
    monkeypatch.setattr(procs, "log_tail", lambda name, lines=20: log)
    node = _node(Path("/nonexistent"))
    assert node.unprepare_failures("hv-pod-1") == 2  # each retry is a line
    assert node.unprepare_failures("hv-pod-12") == 1 and node.unprepare_failures("hv-pod") == 0
    assert not unprepare_failed(FAILED.replace('"Error syncing pod, skipping"', '"x"'), "hv-pod-1")
