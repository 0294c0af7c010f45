"""The kubelet emulator against a minimal plugin: real unix sockets, real grpc.aio."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from asyncinotify import Event, Inotify, Mask

from conformance.kubelet import (
    PHASE_FAILED,
    PHASE_PENDING,
    PHASE_RUNNING,
    REASON_ADMISSION,
    REASON_INSUFFICIENT,
    REASON_PRESTART,
    AllocationRecord,
    EventKind,
    KubeletEmulator,
    ThreadedKubeletEmulator,
    WaitTimeout,
    is_extended_resource_name,
)
from conformance.kubelet import checkpoint as ckpt
from conformance.kubelet.sockets import KubeletSocket
from conformance.kubelet.validation import go_join, go_quote
from plugin.api import deviceplugin_pb2 as pb
from tests.conformance.minimal_plugin import Faults, MinimalPlugin

RES = "example.com/dev"
MINIMAL_PLUGIN = Path(__file__).with_name("minimal_plugin.py")


def run(coro: Coroutine[Any, Any, None], timeout: float = 60.0) -> None:
    """Run one async scenario with an overall deadline."""

    async def bounded() -> None:
        async with asyncio.timeout(timeout):
            await coro

    asyncio.run(bounded())


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Short base path: unix socket paths are limited to 107 bytes.
    base = Path(tempfile.mkdtemp(prefix="kem-"))
    try:
        yield base / "device-plugins"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.asynccontextmanager
async def kubelet(plugin_dir: Path, **kwargs: Any) -> AsyncIterator[KubeletEmulator]:
    emu = KubeletEmulator(plugin_dir, **kwargs)
    await emu.start()
    try:
        yield emu
    finally:
        await emu.stop()


@contextlib.asynccontextmanager
async def device_plugin(
    plugin_dir: Path, *, start: bool = True, **kwargs: Any
) -> AsyncIterator[MinimalPlugin]:
    plugin = MinimalPlugin(plugin_dir, **kwargs)
    if start:
        await plugin.start()
    try:
        yield plugin
    finally:
        await plugin.stop()


def bind_dead_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))


def names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


def file_mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def is_socket(path: Path) -> bool:
    return path.exists() and stat.S_ISSOCK(path.lstat().st_mode)


async def events_until(
    ino: Inotify, done: Callable[[Event], bool], within_s: float = 10.0
) -> list[tuple[str, Mask]]:
    """Collect inotify events up to and including the first for which done() holds."""
    seen: list[tuple[str, Mask]] = []
    async with asyncio.timeout(within_s):
        async for ev in ino:
            seen.append((str(ev.name), ev.mask))
            if done(ev):
                return seen
    raise AssertionError("inotify stream ended")


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


# --- admission ------------------------------------------------------------------------------


def test_allocate_success_carries_cdi(plugin_dir: Path) -> None:
    async def scenario() -> None:
        async with kubelet(plugin_dir) as emu, device_plugin(plugin_dir) as plugin:
            await emu.wait_for_counts(RES, allocatable=2, timeout=10)
            out = await emu.allocate(RES, 1, "vm")
            assert out.ok and out.phase == PHASE_RUNNING and out.device_ids == ("dev-0",)
            assert out.response is not None
            assert [d.name for d in out.response.cdi_devices] == [f"{RES}=dev-0"]
            assert out.response.envs["MINIMAL_DEVICES"] == "dev-0"
            (req,) = plugin.allocate_requests
            assert [list(c.devices_ids) for c in req.container_requests] == [["dev-0"]]
            (view,) = emu.allocations()
            assert view.container == "vm" and view.device_ids == ("dev-0",)
            assert view.response.devices[0].permissions == "rw"
            assert not plugin.preferred_requests  # not advertised, never called
            short = await emu.allocate(RES, 2)
            assert not short.ok and short.reason == REASON_INSUFFICIENT
            assert "Requested: 2, Available: 1" in short.message
            assert emu.release(out.allocation or 0)
            assert (await emu.allocate(RES, 2)).ok

    run(scenario())


@pytest.mark.parametrize(
    ("faults", "err"),
    [
        (Faults(allocate_error="boom"), "rpc error: code = Internal desc = boom"),
        (
            Faults(allocate_empty=True),
            "no containers return in allocation response "
            "&AllocateResponse{ContainerResponses:[]*ContainerAllocateResponse{},}",
        ),
    ],
)
def test_allocate_error_is_admission_error(plugin_dir: Path, faults: Faults, err: str) -> None:
    async def scenario() -> None:
        async with kubelet(plugin_dir) as emu, device_plugin(plugin_dir, faults=faults) as plugin:
            await emu.wait_for_counts(RES, allocatable=2, timeout=10)
            out = await emu.allocate(RES, 1)
            assert (out.ok, out.phase, out.reason) == (False, PHASE_FAILED, REASON_ADMISSION)
            assert (
                out.message
                == f"Pod was rejected: Allocate failed due to {err}, which is unexpected"
            )
            assert len(plugin.allocate_requests) == 1  # no retry
            assert emu.allocations() == [] and emu.accounting.in_use(RES) == set()

    run(scenario())


def test_preferred_allocation(plugin_dir: Path) -> None:
    options = pb.DevicePluginOptions(get_preferred_allocation_available=True)
    faults = Faults(preferred=["dev-2"])

    async def scenario() -> None:
        async with (
            kubelet(plugin_dir) as emu,
            device_plugin(plugin_dir, device_count=4, options=options, faults=faults) as plugin,
        ):
            await emu.wait_for_counts(RES, allocatable=4, timeout=10)
            first = await emu.allocate(RES, 1)
            assert first.device_ids == ("dev-2",) and first.preferred == ("dev-2",)
            # Unknown or used IDs are dropped; the kubelet fills the shortfall itself.
            faults.preferred = ["bogus", "dev-2", "dev-3"]
            second = await emu.allocate(RES, 2)
            assert second.ok and second.device_ids == ("dev-3", "dev-0")
            req = plugin.preferred_requests[-1].container_requests[0]
            assert list(req.available_deviceIDs) == ["dev-0", "dev-1", "dev-3"]
            assert list(req.must_include_deviceIDs) == [] and req.allocation_size == 2

    run(scenario())


def test_prestart(plugin_dir: Path) -> None:
    options = pb.DevicePluginOptions(pre_start_required=True)

    async def scenario() -> None:
        async with kubelet(plugin_dir) as emu, device_plugin(plugin_dir, options=options) as plugin:
            await emu.wait_for_counts(RES, allocatable=2, timeout=10)
            assert (await emu.allocate(RES, 1)).ok
            assert [list(r.devices_ids) for r in plugin.prestart_requests] == [["dev-0"]]
            plugin.faults.prestart_error = "not ready"
            out = await emu.allocate(RES, 1)
            assert (out.ok, out.phase, out.reason) == (False, PHASE_PENDING, REASON_PRESTART)
            assert out.message == (
                "device plugin PreStartContainer rpc failed with err: "
                "rpc error: code = Internal desc = not ready"
            )
            assert out.allocation is not None  # admitted: the devices stay assigned

    run(scenario())


# --- re-registration ------------------------------------------------------------------------


def test_reregistration_replaces_endpoint(plugin_dir: Path) -> None:
    async def scenario() -> None:
        async with (
            kubelet(plugin_dir) as emu,
            device_plugin(plugin_dir, socket_name="a.sock") as old,
            device_plugin(plugin_dir, socket_name="b.sock", device_count=3) as new,
        ):
            await emu.wait_for_counts(RES, capacity=3, allocatable=3, timeout=10)
            assert [r.endpoint for r in emu.registrations(RES)] == ["a.sock", "b.sock"]
            # The kubelet closed the old stream; its (late) end is ignored.
            await old.wait_until(lambda: old.streams_ended == 1, 10, "old stream closed")
            await emu.wait_for(
                lambda: any(
                    e.detail.get("stale") for e in emu.accounting.timeline(EventKind.STREAM_ENDED)
                ),
                10,
                "the old stream's end to be seen",
            )
            old.set_devices({})
            await old.stop()
            assert (emu.capacity(RES), emu.allocatable(RES)) == (3, 3)
            assert (await emu.allocate(RES, 1)).ok and len(new.allocate_requests) == 1

    run(scenario())


def test_stale_client_bug_emulated(plugin_dir: Path) -> None:
    async def scenario() -> None:
        async with (
            kubelet(plugin_dir, emulate_stale_client_bug=True) as emu,
            device_plugin(plugin_dir, socket_name="a.sock") as old,
            device_plugin(plugin_dir, socket_name="b.sock", device_count=3) as new,
        ):
            await emu.wait_for_counts(RES, capacity=3, allocatable=3, timeout=10)
            assert old.active_streams == 1  # upstream leaves the old stream running
            old.end_streams()
            await emu.wait_for_counts(RES, capacity=3, allocatable=0, timeout=10)
            stale = [
                e for e in emu.accounting.timeline(EventKind.STREAM_ENDED) if e.detail["stale"]
            ]
            assert stale[0].detail["disconnected_current"] is True
            await new.register()  # the only way out: register again
            await emu.wait_for_counts(RES, capacity=3, allocatable=3, timeout=10)

    run(scenario())


# --- restarts ---------------------------------------------------------------------------------


def test_graceful_restart(plugin_dir: Path) -> None:
    async def scenario() -> None:
        async with kubelet(plugin_dir) as emu, device_plugin(plugin_dir) as plugin:
            await emu.wait_for_counts(RES, capacity=2, allocatable=2, timeout=10)
            await emu.stop(graceful=True)
            assert not emu.kubelet_socket.exists()
            assert plugin.socket_path.exists()
            await emu.start()
            assert not plugin.socket_path.exists()  # start-up cleanup deleted it
            assert emu.accounting.resource_names() == [RES]  # from the checkpoint ...
            assert emu.capacity(RES) == 0  # ... with no devices until re-registration
            await plugin.restart_and_register()
            await emu.wait_for_counts(RES, capacity=2, allocatable=2, timeout=10)
            latency = emu.reregistration_latency(RES)
            assert latency is not None and latency > 0

    run(scenario())


def test_crash_restart(plugin_dir: Path) -> None:
    async def scenario() -> None:
        async with (
            kubelet(plugin_dir) as emu,
            device_plugin(plugin_dir, watch_interval_s=0.02) as plugin,
        ):
            await emu.wait_for_counts(RES, capacity=2, allocatable=2, timeout=10)
            held = await emu.allocate(RES, 1)
            first_socket = plugin.socket_path
            with Inotify() as ino:
                ino.add_watch(plugin_dir, Mask.CREATE | Mask.DELETE | Mask.MOVED_TO)
                await emu.stop(graceful=False)
                (plugin_dir / "marker").touch()
                seen = await events_until(ino, lambda ev: str(ev.name) == "marker")
                assert [n for n, _ in seen if n == "kubelet.sock"] == []  # a crash is silent
                assert is_socket(emu.kubelet_socket)
                with socket.socket(socket.AF_UNIX) as s, pytest.raises(ConnectionRefusedError):
                    s.connect(str(emu.kubelet_socket))
                await emu.start()
                assert emu.capacity(RES) == 0  # checkpointed, no devices until re-registration
                seen = await events_until(
                    ino, lambda ev: str(ev.name) == "kubelet.sock" and Mask.CREATE in ev.mask
                )
            deleted = [n for n, m in seen if Mask.DELETE in m]
            assert deleted[:2] == sorted(["kubelet.sock", first_socket.name])
            (restored,) = emu.allocations()
            assert restored.restored and restored.device_ids == held.device_ids
            # The plugin noticed its socket vanish and registered again by itself.
            await emu.wait_for_counts(RES, capacity=2, allocatable=2, timeout=10)
            latency = emu.reregistration_latency(RES)
            assert latency is not None and 0 < latency < 5
            assert len(plugin.allocate_requests) == 1  # the running container is not re-allocated
            assert not (await emu.allocate(RES, 2)).ok  # its device is still in use

    run(scenario())


# --- threaded facade and teardown -------------------------------------------------------------


def _threads() -> set[threading.Thread]:
    return set(threading.enumerate())


def test_threaded_facade_with_subprocess_plugin(plugin_dir: Path) -> None:
    before = _threads()
    emu = ThreadedKubeletEmulator(plugin_dir, grace_period_s=0.5)
    emu.start()
    proc = subprocess.Popen(
        [sys.executable, str(MINIMAL_PLUGIN), "--plugin-dir", str(plugin_dir), "--count", "2"],
        stdout=subprocess.DEVNULL,
    )
    try:
        emu.wait_for_counts(RES, capacity=2, allocatable=2, timeout=20)
        out = emu.allocate(RES, 1, "vm", timeout=10)
        assert out.ok and out.response is not None and out.response.cdi_devices
        proc.send_signal(signal.SIGKILL)
        emu.wait_for_counts(RES, capacity=2, allocatable=0, timeout=10)
        emu.wait_for_counts(RES, capacity=0, timeout=10)
    finally:
        proc.kill()
        proc.wait(10)
        emu.stop()
    # Only the SIGKILLed plugin's socket remains (nobody cleaned up after it).
    assert {p.name for p in plugin_dir.iterdir() if is_socket(p)} == {"minimal.sock"}
    assert names(plugin_dir.parent) == {"device-plugins"}
    assert not [t for t in _threads() - before if t.name.startswith("kubelet-emulator")]
    assert emu.leftover_tasks == []


def test_stop_leaves_no_sockets_no_threads(plugin_dir: Path) -> None:
    before = _threads()
    emu = ThreadedKubeletEmulator(plugin_dir)
    emu.start()
    plugin = MinimalPlugin(plugin_dir)
    emu.call(plugin.start, 10, "plugin start")
    emu.wait_for_counts(RES, capacity=2, timeout=10)
    emu.call(plugin.stop, 10, "plugin stop")
    emu.stop()
    assert [p.name for p in plugin_dir.iterdir() if is_socket(p)] == []
    assert names(plugin_dir.parent) == {"device-plugins"}
    assert emu.leftover_tasks == []
    # grpc's poller thread lives as long as its loop's objects; collect them and wait.
    deadline = time.monotonic() + 10
    while _threads() - before and time.monotonic() < deadline:
        gc.collect()
        next(iter(_threads() - before)).join(0.1)
    assert _threads() - before == set()


def test_async_stop_leaves_no_tasks(plugin_dir: Path) -> None:
    async def scenario() -> None:
        emu = KubeletEmulator(plugin_dir, grace_period_s=60)
        await emu.start()
        async with device_plugin(plugin_dir) as plugin:
            await emu.wait_for_counts(RES, capacity=2, timeout=10)
            plugin.end_streams()  # leaves a stopped endpoint with its grace timer pending
            await emu.wait_for_counts(RES, allocatable=0, timeout=10)
            await emu.stop()
        assert asyncio.all_tasks() == {asyncio.current_task()}
        assert not emu.kubelet_socket.exists()

    run(scenario())


def test_crash_without_hard_link_still_leaves_socket(
    plugin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(KubeletSocket, "_make_private_dir", lambda self: None)

    async def scenario() -> None:
        async with kubelet(plugin_dir) as emu, device_plugin(plugin_dir):
            await emu.wait_for_counts(RES, capacity=2, timeout=10)
            await emu.stop(graceful=False)
            assert is_socket(emu.kubelet_socket)
            await emu.start()
            assert is_socket(emu.kubelet_socket) and emu.capacity(RES) == 0

    run(scenario())
