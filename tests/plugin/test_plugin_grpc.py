"""The real plugin process against a kubelet stub: registration, streams, Allocate codes."""

from __future__ import annotations

import os
import time

import grpc
import pytest

from hv_device_plugin.api import deviceplugin_pb2 as pb
from tests.plugin.kubelet_stub import KubeletStub
from tests.plugin.plugin_process import Node, PluginProcess, Stream, wait_for

CDI_NAME = "hyperlight.dev/hypervisor=kvm"


def test_serves_before_registering(plugin: PluginProcess, kubelet: KubeletStub) -> None:
    reg = kubelet.registrations[0]
    assert reg.serving, f"plugin registered before serving: {reg.error}"
    assert reg.version == "v1beta1"
    assert reg.resource_name == "hyperlight.dev/hypervisor"
    assert reg.endpoint.startswith("hyperlight-") and reg.endpoint.endswith(".sock")
    assert "/" not in reg.endpoint


def test_reregisters_after_kubelet_restart(plugin: PluginProcess, kubelet: KubeletStub) -> None:
    first = kubelet.registrations[0].endpoint
    latencies = []
    names = [first]
    for _ in range(3):
        started = kubelet.restart()
        reg = kubelet.wait_serving_after(started, 20)
        names.append(reg.endpoint)
        latencies.append(reg.at - started)
    # A fresh socket name per start: the kubelet bug with a late old-stream end cannot bite.
    assert len(set(names)) == len(names)
    print(f"re-registration after kubelet.sock re-creation: {[round(x, 4) for x in latencies]} s")


def test_health_change_reaches_every_stream_and_cancel_is_isolated(
    plugin: PluginProcess, node: Node
) -> None:
    streams = [Stream(plugin.socket()) for _ in range(3)]
    try:
        for i, s in enumerate(streams):
            wait_for(lambda s=s: s.healthy_count() == 4, 10, f"stream {i} initial healthy snapshot")
        wait_for(plugin.ready, 10, "readiness with 3 streams")
        (node.host_dev / "kvm").unlink()
        for i, s in enumerate(streams):
            wait_for(lambda s=s: s.healthy_count() == 0, 10, f"stream {i} unhealthy snapshot")
        assert all(len(s.snapshots[-1]) == 4 for s in streams), "capacity must stay advertised"
        status, body = plugin.http("/readyz")
        assert status == 503 and any("device" in r for r in body["reasons"])
        assert plugin.http("/healthz")[0] == 200
        os.mknod(node.host_dev / "kvm", 0o600 | 0o020000, os.stat("/dev/kvm").st_rdev)
        for i, s in enumerate(streams):
            wait_for(lambda s=s: s.healthy_count() == 4, 10, f"stream {i} recovery snapshot")

        streams[0].cancel()
        seen = [len(s.snapshots) for s in streams[1:]]
        # The cancel reaches the plugin asynchronously: wait for its count, then still ready.
        wait_for(
            lambda: plugin.http("/readyz")[1]["conditions"]["list_and_watch"]["streams"] == 2,
            10,
            "the plugin counting 2 streams after one was cancelled",
        )
        assert plugin.ready(), "readiness after cancelling one stream"
        assert not any(s.ended.is_set() for s in streams[1:]), "other streams must stay open"
        assert [len(s.snapshots) for s in streams[1:]] == seen, "cancel must not broadcast"
        assert all(s.healthy_count() == 4 for s in streams[1:])
    finally:
        for s in streams:
            s.cancel()


@pytest.mark.parametrize(
    ("ids", "needle"),
    [(("kvm-99",), "unknown device IDs: kvm-99"), (("kvm-1", "kvm-1"), "duplicate device IDs")],
)
def test_allocate_rejects_bad_ids(plugin: PluginProcess, ids: tuple[str, ...], needle: str) -> None:
    stream = Stream(plugin.socket())
    try:
        wait_for(plugin.ready, 10, "readiness")
        with pytest.raises(grpc.RpcError) as err:
            plugin.allocate(*ids)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in (err.value.details() or "")
    finally:
        stream.cancel()


def test_allocate_success_and_unavailable_when_device_gone(
    plugin: PluginProcess, node: Node
) -> None:
    stream = Stream(plugin.socket())
    try:
        wait_for(plugin.ready, 10, "readiness")
        resp = plugin.allocate("kvm-0")
        (c,) = resp.container_responses
        assert [d.name for d in c.cdi_devices] == [CDI_NAME]
        assert dict(c.envs) == {
            "HYPERLIGHT_HYPERVISOR": "kvm",
            "HYPERLIGHT_DEVICE_PATH": "/dev/kvm",
        }
        assert not c.devices, "workloads get the device through CDI only"
        (node.host_dev / "kvm").unlink()
        with pytest.raises(grpc.RpcError) as err:
            plugin.allocate("kvm-1")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "device" in (err.value.details() or "")
    finally:
        stream.cancel()


def test_allocate_refused_without_stream(plugin: PluginProcess) -> None:
    with pytest.raises(grpc.RpcError) as err:
        plugin.allocate("kvm-0")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "ListAndWatch" in (err.value.details() or "")


def test_preferred_allocation_is_deterministic(plugin: PluginProcess) -> None:
    channel, stub = plugin.stub()
    with channel:
        opts = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        assert opts.get_preferred_allocation_available and not opts.pre_start_required
        req = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=["kvm-3", "kvm-1", "kvm-2"],
                    must_include_deviceIDs=["kvm-2"],
                    allocation_size=2,
                )
            ]
        )
        answers = {
            tuple(stub.GetPreferredAllocation(req, timeout=5).container_responses[0].deviceIDs)
            for _ in range(5)
        }
    assert answers == {("kvm-2", "kvm-1")}


def test_sigterm_sends_empty_list_and_removes_socket(node: Node, kubelet: KubeletStub) -> None:
    proc = PluginProcess(node, kubelet)
    kubelet.wait_registrations(1, 20)
    sock = proc.socket()
    stream = Stream(sock)
    wait_for(lambda: stream.healthy_count() == 4, 10, "initial snapshot")
    started = time.monotonic()
    assert proc.stop() == 0
    assert stream.ended.wait(5)
    assert stream.snapshots[-1] == [], "last snapshot before exit must be an empty list"
    assert not sock.exists()
    assert time.monotonic() - started < 10
