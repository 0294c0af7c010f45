"""The kubelet emulator: name rules, start-up, registration and accounting."""

from __future__ import annotations

import os
import time
from pathlib import Path

import grpc
import pytest

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hvconform.kubelet import (
    AllocationRecord,
    EventKind,
    WaitTimeout,
    is_extended_resource_name,
)
from hvconform.kubelet import checkpoint as ckpt
from hvconform.kubelet.validation import go_join, go_quote
from tests.conformance.emulator_support import (
    RES,
    bind_dead_socket,
    device_plugin,
    file_mode,
    is_socket,
    kubelet,
    names,
    run,
)
from tests.conformance.minimal_plugin import Faults

# --- rules and formats ------------------------------------------------------------------


VALID_NAMES = [
    "example.com/dev",
    "hyperlight.dev/hypervisor",
    "devices.kubevirt.io/kvm",
    "nvidia.com/gpu",
    "example.com/A.b-c_D",
    "1.2.3/x",
    "example.com/" + "k" * 63,
    "a" * 244 + "/x",  # the kubelet checks "requests." + name: 9 + 244 = 253
]
INVALID_NAMES = [
    "nodomain",
    "kubernetes.io/kvm",
    "foo.kubernetes.io/kvm",
    "requests.example.com/kvm",
    "example.com/",
    "/kvm",
    "Example.com/kvm",
    "example.com/-kvm",
    "example.com/kvm_",
    "a/b/c",
    "example.com/" + "k" * 64,
    "a" * 245 + "/x",
    "exämple.com/kvm",
    'example.com/"q"',
]


def test_resource_name_rules() -> None:
    for name in VALID_NAMES:
        assert is_extended_resource_name(name), name
    for name in INVALID_NAMES:
        assert not is_extended_resource_name(name), name


def test_go_formats() -> None:
    assert go_quote('a"b\\c\n\x01é') == '"a\\"b\\\\c\\n\\x01é"'
    assert go_join("/d/p", "x.sock") == "/d/p/x.sock"
    assert go_join("/d/p", "/abs.sock") == "/d/p/abs.sock"  # Join never drops dir
    assert go_join("/d/p", "../up.sock") == "/d/up.sock"
    assert go_join("/d/p", "") == "/d/p"


def test_checkpoint_roundtrip(plugin_dir: Path) -> None:
    plugin_dir.mkdir(parents=True)
    resp = pb.ContainerAllocateResponse(cdi_devices=[pb.CDIDevice(name="a.b/c=d")])
    rec = AllocationRecord(7, "uid", "c0", RES, ("d",), resp, 1.0)
    ckpt.write(plugin_dir / "ck", ckpt.encode({RES: ["d"]}, [rec]))
    data = ckpt.read(plugin_dir / "ck")
    assert data is not None and data.registered == {RES: ["d"]}
    assert data.allocations[0].alloc_id == 7 and data.allocations[0].response == resp
    assert data.allocations[0].restored
    assert sorted(p.name for p in plugin_dir.iterdir()) == ["ck"]  # no temp file left


# --- start-up and registration ----------------------------------------------------------


def test_startup_cleanup(plugin_dir: Path) -> None:
    plugin_dir.mkdir(parents=True)
    (plugin_dir / "sub").mkdir()
    bind_dead_socket(plugin_dir / "sub" / "inner.sock")
    bind_dead_socket(plugin_dir / "stale.sock")
    bind_dead_socket(plugin_dir / "kubelet.sock")
    (plugin_dir / "notes.txt").write_text("keep")
    (plugin_dir / "kubelet_internal_checkpoint").write_text("not json")
    (plugin_dir / "link.sock").symlink_to(plugin_dir / "stale.sock")

    async def scenario() -> None:
        async with kubelet(plugin_dir) as emu:
            assert names(plugin_dir) == {
                "sub",
                "notes.txt",
                "kubelet_internal_checkpoint",
                "DEPRECATION",
                "kubelet.sock",
            }
            assert (plugin_dir / "DEPRECATION").read_bytes() == b""
            assert is_socket(plugin_dir / "sub" / "inner.sock")
            assert (plugin_dir / "kubelet_internal_checkpoint").read_text() == "not json"
            assert is_socket(emu.kubelet_socket)
            (cleaned,) = emu.accounting.timeline(EventKind.SOCKETS_CLEANED)
            assert cleaned.detail["removed"] == ["kubelet.sock", "link.sock", "stale.sock"]

    run(scenario())


def test_fresh_dir_mode(plugin_dir: Path) -> None:
    async def scenario() -> None:
        async with kubelet(plugin_dir):
            umask = os.umask(0)
            os.umask(umask)
            assert file_mode(plugin_dir) == 0o750 & ~umask

    run(scenario())


def test_register_bad_version(plugin_dir: Path) -> None:
    async def scenario() -> None:
        async with (
            kubelet(plugin_dir) as emu,
            device_plugin(plugin_dir, start=False, version="v1alpha") as plugin,
        ):
            await plugin.serve()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await plugin.register()
            assert err.value.code() == grpc.StatusCode.UNKNOWN
            assert err.value.details() == (
                'requested API version "v1alpha" is not supported by kubelet. '
                'Supported version is ["v1beta1"]'
            )
            assert plugin.list_and_watch_calls == 0
            assert not emu.registrations(RES)[0].ok

    run(scenario())


def test_register_resource_names(plugin_dir: Path) -> None:
    async def scenario() -> None:
        async with kubelet(plugin_dir) as emu:
            for name in INVALID_NAMES:
                async with device_plugin(plugin_dir, start=False, resource_name=name) as plugin:
                    await plugin.serve()
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await plugin.register()
                    assert err.value.code() == grpc.StatusCode.UNKNOWN
                    assert err.value.details() == f"the ResourceName {go_quote(name)} is invalid"
            assert err.value.details() == 'the ResourceName "example.com/\\"q\\"" is invalid'
            for name in ("hyperlight.dev/hypervisor", "a" * 244 + "/x"):
                async with device_plugin(plugin_dir, resource_name=name):
                    await emu.wait_for_counts(name, capacity=2, timeout=10)

    run(scenario())


def test_register_before_serving_hits_dial_deadline(plugin_dir: Path) -> None:
    async def scenario() -> None:
        async with (
            kubelet(plugin_dir, dial_timeout_s=0.3) as emu,
            device_plugin(plugin_dir, start=False) as plugin,
        ):
            began = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await plugin.register()
            assert time.monotonic() - began >= 0.3  # the dial blocked until its deadline
            assert err.value.code() == grpc.StatusCode.UNKNOWN
            assert err.value.details() == "failed to dial device plugin: context deadline exceeded"
            assert emu.accounting.resource_names() == []

    run(scenario())


def test_options_failure_never_registers(plugin_dir: Path) -> None:
    async def scenario() -> None:
        async with (
            kubelet(plugin_dir) as emu,
            device_plugin(plugin_dir, start=False, faults=Faults(fail_options=True)) as plugin,
        ):
            await plugin.serve()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await plugin.register()
            assert err.value.code() == grpc.StatusCode.UNKNOWN
            assert err.value.details() == (
                "failed to get device plugin options: "
                "rpc error: code = Unavailable desc = options broken"
            )
            assert plugin.list_and_watch_calls == 0
            assert emu.capacity(RES) == 0 and emu.accounting.resource_names() == []

    run(scenario())


def test_options_from_rpc_not_request(plugin_dir: Path) -> None:
    async def scenario() -> None:
        async with (
            kubelet(plugin_dir) as emu,
            device_plugin(
                plugin_dir, options=pb.DevicePluginOptions(pre_start_required=True)
            ) as plugin,
        ):
            del plugin
            rec = emu.registrations(RES)[-1]
            assert rec.ok and rec.options is not None and rec.options.pre_start_required

    run(scenario())


# --- accounting ---------------------------------------------------------------------------


def test_snapshot_accounting(plugin_dir: Path) -> None:
    async def scenario() -> None:
        async with kubelet(plugin_dir) as emu, device_plugin(plugin_dir, device_count=4) as plugin:
            await emu.wait_for_counts(RES, capacity=4, allocatable=4, timeout=10)
            plugin.set_health("dev-1", False)
            await emu.wait_for_counts(RES, capacity=4, allocatable=3, timeout=10)
            # Only the exact string "Healthy" is healthy.
            plugin.set_devices({"a": "Healthy", "b": "healthy", "c": "", "d": "Unhealthy"})
            await emu.wait_for_counts(RES, capacity=4, allocatable=1, timeout=10)
            assert emu.accounting.state(RES).healthy == {"a"}
            # The kubelet keeps healthy and unhealthy sets: a duplicated ID counts in both.
            plugin.push_raw([("x", "Healthy"), ("x", "Unhealthy"), ("y", "Healthy")])
            await emu.wait_for_counts(RES, capacity=3, allocatable=2, timeout=10)
            snapshot = emu.accounting.timeline(EventKind.SNAPSHOT, RES)[-1]
            assert snapshot.detail["duplicates"] == ["x"]
            plugin.set_devices({})
            await emu.wait_for_counts(RES, capacity=0, allocatable=0, timeout=10)
            assert emu.accounting.resource_names() == [RES]  # known, just empty

    run(scenario())


@pytest.mark.parametrize(
    ("code", "reason"),
    [(None, "EOF"), (grpc.StatusCode.UNAVAILABLE, "rpc error: code = Unavailable desc = gone")],
)
def test_stream_end_then_grace_removal(
    plugin_dir: Path, code: grpc.StatusCode | None, reason: str
) -> None:
    async def scenario() -> None:
        async with (
            kubelet(plugin_dir, grace_period_s=0.5) as emu,
            device_plugin(plugin_dir) as plugin,
        ):
            await emu.wait_for_counts(RES, capacity=2, allocatable=2, timeout=10)
            plugin.end_streams(code, "gone")
            await emu.wait_for_counts(RES, capacity=2, allocatable=0, timeout=10)
            (ended,) = emu.accounting.timeline(EventKind.STREAM_ENDED, RES)
            # At once: the same event that records the end sees allocatable 0, capacity kept.
            assert ended.detail["reason"] == reason
            assert (ended.detail["capacity"], ended.detail["allocatable"]) == (2, 0)
            await emu.wait_for_counts(RES, capacity=0, timeout=10)
            (removed,) = emu.accounting.timeline(EventKind.RESOURCE_REMOVED, RES)
            assert removed.t - ended.t >= 0.5
            assert RES not in emu.accounting.resource_names()

    run(scenario())


def test_reregistration_within_grace_keeps_resource(plugin_dir: Path) -> None:
    async def scenario() -> None:
        async with (
            kubelet(plugin_dir, grace_period_s=0.5) as emu,
            device_plugin(plugin_dir) as plugin,
        ):
            await emu.wait_for_counts(RES, capacity=2, allocatable=2, timeout=10)
            plugin.end_streams()
            await emu.wait_for_counts(RES, allocatable=0, timeout=10)
            await plugin.register()
            await emu.wait_for_counts(RES, capacity=2, allocatable=2, timeout=10)
            # Consistently: the cancelled grace timer must not remove it later.
            with pytest.raises(WaitTimeout, match="removal despite re-registration"):
                await emu.wait_for(
                    lambda: emu.capacity(RES) == 0, 1.0, "removal despite re-registration"
                )

    run(scenario())


def test_wait_timeout_names_the_wait(plugin_dir: Path) -> None:
    async def scenario() -> None:
        async with kubelet(plugin_dir) as emu:
            with pytest.raises(WaitTimeout) as err:
                await emu.wait_for_counts(RES, capacity=3, timeout=0.05)
            assert f"{RES} to report capacity=3" in str(err.value)
            assert err.value.last_observed == {"capacity": 0, "allocatable": 0}

    run(scenario())
