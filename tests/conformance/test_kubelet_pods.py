"""The kubelet emulator's pods, checked against what the v1.37.2 kubelet does with them.

Each test names the kubelet code or e2e test it follows (pkg/kubelet/cm/devicemanager/manager.go,
pkg/kubelet/apis/podresources/server_v1.go, test/e2e_node/device_plugin_test.go). The plugin is
the real gRPC minimal plugin; the container runtime records what the kubelet asked of it.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hvconform.kubelet import PHASE_FAILED, PHASE_RUNNING, REASON_ADMISSION, KubeletEmulator
from hvconform.kubelet import checkpoint as checkpoint_file
from hvconform.kubelet.pods import PodRecord
from tests.conformance.emulator_support import RES, device_plugin, kubelet, run


class RecordingRuntime:
    """A container runtime whose containers are names: started, listed running, stopped."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.stopped: list[str] = []
        self._ids = itertools.count(1)

    def start_container(self, pod: PodRecord, response: pb.ContainerAllocateResponse) -> str:
        container_id = f"ctr-{next(self._ids)}"
        self.running.add(container_id)
        return container_id

    def running_containers(self) -> set[str]:
        return set(self.running)

    def stop_container(self, container_id: str) -> None:
        self.running.discard(container_id)
        self.stopped.append(container_id)

    def remove_every_sandbox(self) -> None:
        """What the e2e reboot test does through CRI while the kubelet is down."""
        self.running.clear()


def _pods(emu: KubeletEmulator) -> dict[str, PodRecord]:
    assert emu.pods is not None
    return {p.uid: p for p in emu.pods.pods()}


def _checkpointed(emu: KubeletEmulator) -> set[str]:
    data = checkpoint_file.read(emu.checkpoint_path)
    return set() if data is None else {a.pod_uid for a in data.allocations}


def test_running_pods_survive_graceful_and_crash_restarts(plugin_dir: Path) -> None:
    """isContainerAlreadyRunning: no Allocate, same container, same devices (#118559)."""

    async def scenario() -> None:
        runtime = RecordingRuntime()
        async with kubelet(plugin_dir) as emu, device_plugin(plugin_dir) as plugin:
            emu.attach_runtime(runtime)
            assert emu.pods is not None
            await emu.wait_for_counts(RES, capacity=2, allocatable=2, timeout=10)
            pod = await emu.pods.create(RES)
            assert (pod.phase, pod.container_id) == (PHASE_RUNNING, "ctr-1")
            listed = emu.pods.list_devices()
            for graceful in (True, False):
                await emu.stop(graceful=graceful)
                await emu.start()  # re-admission runs before start returns
                now = _pods(emu)[pod.uid]
                assert (now.phase, now.container_id, now.restart_count) == (
                    PHASE_RUNNING,
                    "ctr-1",
                    0,
                )
                await plugin.restart_and_register()
                await emu.wait_for_counts(RES, capacity=2, allocatable=2, timeout=10)
                assert emu.pods.list_devices() == listed
            assert len(plugin.allocate_requests) == 1  # never allocated again
            assert runtime.stopped == []

    run(scenario())


def test_reboot_fails_pods_until_the_plugin_is_back_then_the_controller_replaces(
    plugin_dir: Path,
) -> None:
    """e2e "Does not keep device plugin assignments across node reboots if fails admission":
    sandboxes gone, the plugin not back: UnexpectedAdmissionError; the failed pod leaves the
    pod-resources List (#132028); its controller's new pod runs once a device is healthy."""

    async def scenario() -> None:
        runtime = RecordingRuntime()
        async with kubelet(plugin_dir) as emu, device_plugin(plugin_dir) as plugin:
            emu.attach_runtime(runtime)
            assert emu.pods is not None
            await emu.wait_for_counts(RES, capacity=2, allocatable=2, timeout=10)
            old = await emu.pods.create(RES, owner="rs")
            await emu.stop(graceful=False)
            runtime.remove_every_sandbox()
            await emu.start()
            failed = _pods(emu)[old.uid]
            assert (failed.phase, failed.reason) == (PHASE_FAILED, REASON_ADMISSION)
            assert failed.message == (
                "Pod was rejected: Allocate failed due to no healthy devices present; "
                f"cannot allocate unhealthy devices {RES}, which is unexpected"
            )
            assert old.uid not in emu.pods.list_devices()
            await plugin.restart_and_register()

            def replaced() -> bool:
                pods = _pods(emu).values()
                return any(p.owner == "rs" and p.phase == PHASE_RUNNING for p in pods)

            await emu.wait_for(replaced, 10, "the controller's new pod running")
            (new,) = [p for p in _pods(emu).values() if p.phase == PHASE_RUNNING]
            assert new.uid != old.uid and new.container_id in runtime.running
            assert set(emu.pods.list_devices()) == {new.uid}
            assert _checkpointed(emu) == {new.uid}  # the failed pod's devices were freed

    run(scenario())


def test_a_pod_deleted_while_the_kubelet_is_down_loses_its_assignment(plugin_dir: Path) -> None:
    """e2e "[OrphanedPods]": its container killed at start, gone from List; the checkpoint
    drops it at the next write after UpdateAllocatedDevices (a List or an admission)."""

    async def scenario() -> None:
        runtime = RecordingRuntime()
        async with kubelet(plugin_dir) as emu, device_plugin(plugin_dir) as plugin:
            emu.attach_runtime(runtime)
            assert emu.pods is not None
            await emu.wait_for_counts(RES, capacity=2, allocatable=2, timeout=10)
            pod = await emu.pods.create(RES)
            await emu.stop(graceful=False)
            await emu.pods.delete(pod.uid)
            assert pod.container_id in runtime.running  # nobody killed it while down
            await emu.start()
            assert runtime.stopped == [pod.container_id]
            assert _checkpointed(emu) == {pod.uid}  # not yet: sources were not ready
            assert emu.pods.list_devices() == {}
            await plugin.restart_and_register()
            await emu.wait_for(lambda: not _checkpointed(emu), 10, "checkpoint without the pod")

    run(scenario())


def test_a_stream_ended_by_the_kubelet_disconnects_until_a_new_register(plugin_dir: Path) -> None:
    """client.go Run returns, runClient disconnects: every device unhealthy at once, capacity
    kept (grace period); the plugin's stream ends; a new Register restores allocatable."""

    async def scenario() -> None:
        async with kubelet(plugin_dir) as emu, device_plugin(plugin_dir) as plugin:
            await emu.wait_for_counts(RES, capacity=2, allocatable=2, timeout=10)
            await emu.end_stream(RES)
            assert (emu.capacity(RES), emu.allocatable(RES)) == (2, 0)
            await plugin.wait_until(lambda: plugin.active_streams == 0, 10, "stream ended")
            plugin.push()  # nothing is read any more: still zero
            assert emu.allocatable(RES) == 0
            await plugin.restart_and_register()
            await emu.wait_for_counts(RES, capacity=2, allocatable=2, timeout=10)

    run(scenario())


def test_device_health_in_pod_status_is_the_last_advertised(plugin_dir: Path) -> None:
    """UpdateAllocatedResourcesStatus: allDevices' health, which a disconnect leaves as it was."""

    async def scenario() -> None:
        runtime = RecordingRuntime()
        async with kubelet(plugin_dir) as emu, device_plugin(plugin_dir) as plugin:
            emu.attach_runtime(runtime)
            assert emu.pods is not None
            await emu.wait_for_counts(RES, capacity=2, allocatable=2, timeout=10)
            pod = await emu.pods.create(RES)
            (device,) = emu.pods.device_health(pod.uid)
            assert emu.pods.device_health(pod.uid) == {device: "Healthy"}
            plugin.set_health(device, healthy=False)
            await emu.wait_for_counts(RES, allocatable=1, timeout=10)
            assert emu.pods.device_health(pod.uid) == {device: "Unhealthy"}
            plugin.set_health(device, healthy=True)
            await emu.wait_for_counts(RES, allocatable=2, timeout=10)
            await emu.end_stream(RES)
            assert emu.allocatable(RES) == 0
            assert emu.pods.device_health(pod.uid) == {device: "Healthy"}

    run(scenario())
