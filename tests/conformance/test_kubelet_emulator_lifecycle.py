"""The kubelet emulator: admission, re-registration, restarts and teardown."""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from asyncinotify import Inotify, Mask

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hvconform.kubelet import (
    PHASE_FAILED,
    PHASE_PENDING,
    PHASE_RUNNING,
    REASON_ADMISSION,
    REASON_INSUFFICIENT,
    REASON_PRESTART,
    EventKind,
    KubeletEmulator,
    ThreadedKubeletEmulator,
)
from hvconform.kubelet.sockets import KubeletSocket
from tests.conformance.emulator_support import (
    MINIMAL_PLUGIN,
    RES,
    device_plugin,
    events_until,
    is_socket,
    kubelet,
    names,
    run,
)
from tests.conformance.minimal_plugin import Faults, MinimalPlugin

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


def test_the_loop_names_a_task_left_running_but_not_one_on_its_last_step() -> None:
    from hvconform.kubelet import LoopThread

    lt = LoopThread()

    async def never() -> None:
        await asyncio.Event().wait()

    async def leave_tasks() -> None:
        loop = asyncio.get_running_loop()
        leaked = loop.create_task(never(), name="leaked")
        ending = loop.create_task(asyncio.sleep(0.1), name="ending")
        assert not (leaked.done() or ending.done())

    lt.run(leave_tasks, 10, "leave tasks")
    lt.close()
    assert lt.leftover_tasks == ["leaked"]
