"""DRA behaviours the kubelet's own node tests check (test/e2e_node/dra_test.go, v1.37.2), for any
DRA driver under test (CAP_DRA; hvconform.contract.dra):

`dra-kubelet-restart`: a pod holding a prepared claim keeps running across a graceful and a
crash kubelet restart (same container, no restart, its guest counting: "must keep pod running
during kubelet restart"); the restarted kubelet wipes the node's ResourceSlices at start
(pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go NewDRAPluginManager -> wipeResourceSlices) and
the driver must publish its devices again after its re-registration, or nothing new is ever
scheduled on the node ("must be possible to restart the kubelet ... ResourceSlices republished").

`dra-pod-while-kubelet-down`: a pod created and allocated while the kubelet is down runs once the
kubelet is back ("must process pod created when kubelet is not running").

`dra-prepare-retried`: NodePrepareResources that fails (the claim's CDI spec cannot be written:
read-only CDI storage) is retried by the kubelet, also across a kubelet restart, and the pod runs
once the driver can prepare ("must retry NodePrepareResources after a kubelet restart").

`dra-shared-device`: a device published as shareable (allowMultipleAllocations, KEP-5075
consumable capacity, beta and on in v1.37) serves several pods at once: each gets a claim of
its own, prepared with a CDI spec of its own, and every pod's guest runs at the same time; a
driver whose devices are not shareable is not_applicable here (one device per pod).

`dra-no-spec-left`: once a pod is gone the kubelet unprepares its claim and the driver leaves no
CDI spec behind ("must unprepare resources for deleted pod"; a stale spec names a claim nobody
holds and its device IDs, read by every later container creation).

`dra-unprepare-retried`: NodeUnprepareResources that fails (the claim's CDI spec cannot be
removed: read-only CDI storage) is retried by the kubelet across a kubelet restart, and the
driver removes the spec once it can ("must retry NodeUnprepareResources after Kubelet restart").

`dra-registration-socket-removed`: the driver's registration socket removed from the kubelet's
plugins_registry dir (a node cleanup, a careless rm): the kubelet's plugin watcher deregisters the
driver (pluginwatcher handleDeleteEvent -> DRA plugin manager DeRegisterPlugin; its slices wiped
30 s later, dra_plugin_manager.go sync -> wipingDelay) and nothing ever asks it to come back: the
driver must serve a registration socket again by itself, and be registered again.
"""

from __future__ import annotations

from typing import cast

from hvconform.contract.base import specs_declaring
from hvconform.contract.dra import CAP_DRA, CAP_KUBELET_STOP, CAP_REGISTRATION_SOCKET, DraNode
from hvconform.contract.node import (
    CAP_KUBELET_CRASH,
    CAP_READ_ONLY,
    CAP_READINESS,
    Node,
    PodView,
    require,
)
from hvconform.contract.results import EventKind, NotApplicable, Recorder
from hvconform.contract.wait import wait_for
from hvconform.scenarios.common import (
    FAULT_TIMEOUT_S,
    RECOVERY_TIMEOUT_S,
    fresh_guest,
    wait_ready,
)

RUNNING = "Running"
COUNTING_S = 30.0
# The kubelet unprepares a deleted pod's claims in its own cleanup (syncTerminatedPod), not as a
# recovery from a fault: seconds on a quiet node, tens of seconds on a loaded one, whatever
# --recovery-timeout says.
UNPREPARE_TIMEOUT_S = max(RECOVERY_TIMEOUT_S, 120.0)
FAILED, UNPREPARED = "failed", "unprepared"  # what the kubelet's unprepare of a pod came to
# After a failed NodePrepareResources the kubelet tries the pod again at its next pod sync
# (syncFrequency: 1 min by default, as on kind; the node target sets 5 s), not at an error
# backoff of its own: a pod whose prepare can succeed again runs within that, not sooner.
PREPARE_RETRY_TIMEOUT_S = max(RECOVERY_TIMEOUT_S, 120.0)


def _dra(node: Node, *caps: str) -> DraNode:
    require(node, CAP_DRA, *caps)
    return cast(DraNode, node)


def _running(node: DraNode, name: str, label: str, timeout: float = RECOVERY_TIMEOUT_S) -> PodView:
    def running() -> PodView | None:
        pod = node.pod_named(name)
        assert pod is not None, f"pod {name} is gone ({label})"
        assert pod.phase not in ("Failed", "Succeeded"), (
            f"pod {name} ended {pod.phase} {pod.reason}: {pod.message} ({label})"
        )
        return pod if pod.phase == RUNNING and pod.container_id else None

    return wait_for(running, timeout, f"pod {name} running ({label})", interval=0.2)


def _counting(node: DraNode, pod: PodView, label: str) -> None:
    seen = node.pod_counter(pod.uid)
    wait_for(lambda: node.pod_counter(pod.uid) > seen + 2, COUNTING_S,
             f"the guest of pod {pod.name} counting ({label})", interval=0.1)  # fmt: skip


def _spec_made(dra: DraNode, before: set[str]) -> set[str]:
    """The CDI spec files the running pod's claim added (none exists before its prepare)."""
    made: set[str] = wait_for(lambda: set(dra.list_files("cdi")) - before or None,
                              FAULT_TIMEOUT_S, "the claim's CDI spec while the pod runs")  # fmt: skip
    return made


def _republished(node: DraNode, rec: Recorder, before: set[str], back: float, label: str) -> None:
    """The kubelet's start-up wipe seen (the old slices gone), then the driver's devices
    published again, untainted; republish_<label>_s from the kubelet's start (`back`: its
    offset on the check's timeline)."""
    wait_for(lambda: not before & {s.uid for s in node.slices()}, FAULT_TIMEOUT_S,
             f"the kubelet's start-up wipe of the node's ResourceSlices ({label})")  # fmt: skip

    def published() -> bool:
        fresh = [s for s in node.slices() if s.uid not in before]
        return sum(s.devices - s.tainted for s in fresh) > 0

    wait_for(published, RECOVERY_TIMEOUT_S,
             f"the driver's ResourceSlice published again after the wipe ({label})")  # fmt: skip
    rec.metric(f"republish_{label}_s", rec.event(f"slice republished ({label})") - back)


def kubelet_restart(node: Node, rec: Recorder) -> None:
    dra = _dra(node, CAP_KUBELET_STOP)
    wait_ready(dra, rec, "before kubelet restarts")
    pod = dra.start_pod()
    assert pod.phase == RUNNING, f"pod refused before any fault: {pod.reason} {pod.message}"
    _counting(dra, pod, "before kubelet restarts")
    kinds = [True, False] if CAP_KUBELET_CRASH in dra.capabilities else [True]
    for graceful in kinds:
        label = "graceful" if graceful else "crash"
        before = {s.uid for s in dra.slices()}
        dra.stop_kubelet(graceful)
        back = rec.event(
            f"kubelet back after {label} restart", dra.start_kubelet(), kind=EventKind.FAULT
        )
        _republished(dra, rec, before, back, label)
        now = dra.pod_named(pod.name)
        assert now is not None and now.uid == pod.uid, f"pod {pod.name} replaced ({label})"
        assert now.container_id == pod.container_id and now.restart_count == 0, (
            f"pod {pod.name}'s container was restarted across the {label} kubelet restart"
        )
        _counting(dra, pod, f"after {label} kubelet restart")
    fresh_guest(dra, rec, "kubelet restarts")


def pod_while_kubelet_down(node: Node, rec: Recorder) -> None:
    dra = _dra(node, CAP_KUBELET_STOP)
    wait_ready(dra, rec, "before kubelet stop")
    dra.stop_kubelet(True)
    rec.event("kubelet stopped")
    try:
        name = dra.submit_pod()
        rec.event(f"pod {name} created while the kubelet is down")
    finally:
        back = rec.event("kubelet started", dra.start_kubelet())
    pod = _running(dra, name, "created while the kubelet was down")
    rec.metric("running_s", rec.event("pod running") - back)
    _counting(dra, pod, "created while the kubelet was down")


def prepare_retried(node: Node, rec: Recorder) -> None:
    dra = _dra(node, CAP_READ_ONLY, CAP_KUBELET_STOP)
    wait_ready(dra, rec, "before fault")
    # Allocated by the scheduler while nothing is wrong (the kubelet down, so nothing is
    # prepared yet); then the claim's spec cannot be written when the kubelet asks.
    dra.stop_kubelet(True)
    try:
        name = dra.submit_pod()
        wait_for(lambda: dra.pod_scheduled(name), FAULT_TIMEOUT_S,
                 f"pod {name} scheduled (its claim allocated) while the kubelet is down")  # fmt: skip
        dra.set_storage_read_only("cdi", True)
        rec.event("read-only CDI storage", kind=EventKind.FAULT)
    finally:
        back = rec.event("kubelet started", dra.start_kubelet())
    try:
        wait_for(lambda: dra.prepare_failures(name) > 0, RECOVERY_TIMEOUT_S,
                 f"a failed NodePrepareResources for pod {name} (read-only CDI storage)")  # fmt: skip
        rec.metric("first_failure_s", rec.event("NodePrepareResources failed") - back)
        failures = dra.prepare_failures(name)
        dra.stop_kubelet(False)
        dra.start_kubelet()
        rec.event("kubelet restarted while the prepare fails", kind=EventKind.FAULT)
        wait_for(lambda: dra.prepare_failures(name) > failures, PREPARE_RETRY_TIMEOUT_S,
                 "NodePrepareResources retried after the kubelet restart")  # fmt: skip
        pod = dra.pod_named(name)
        assert pod is not None and pod.phase != RUNNING, "the pod ran without its claim prepared"
    finally:
        dra.set_storage_read_only("cdi", False)
    t1 = rec.event("storage writable again", kind=EventKind.REPAIRED)
    pod = _running(dra, name, "after the storage was restored", PREPARE_RETRY_TIMEOUT_S)
    rec.metric("recovery_s", rec.event("pod running") - t1)
    _counting(dra, pod, "after NodePrepareResources succeeded")


SHARING_PODS = 3


def shared_device(node: Node, rec: Recorder) -> None:
    dra = _dra(node)
    wait_ready(dra, rec, "before the pods")
    if not any(s.shared for s in dra.slices()):
        raise NotApplicable(
            "the driver publishes no shareable device (allowMultipleAllocations): one per pod"
        )
    before = set(dra.list_files("cdi"))
    pods: list[PodView] = []
    try:
        for _ in range(SHARING_PODS):
            pod = dra.start_pod()
            assert pod.phase == RUNNING, f"pod {len(pods) + 1} refused: {pod.reason} {pod.message}"
            pods.append(pod)
        rec.event(f"{SHARING_PODS} pods running on the shared device")
        for pod in pods:
            _counting(dra, pod, "sharing the device")
        specs = set(dra.list_files("cdi")) - before
        assert len(specs) >= SHARING_PODS, f"claims' CDI specs {sorted(specs)}: want one per pod"
        rec.metric("pods_sharing", len(pods) + (1 if dra.session_guest else 0))
    finally:
        for pod in pods:
            dra.delete_pod(pod.uid)
    wait_for(lambda: not (set(dra.list_files("cdi")) - before), UNPREPARE_TIMEOUT_S,
             "no CDI spec left after the sharing pods' unprepare")  # fmt: skip


def no_spec_left(node: Node, rec: Recorder) -> None:
    dra = _dra(node)
    wait_ready(dra, rec, "before the pod")
    allocation = dra.allocate()
    assert allocation.ok, f"pod refused: {allocation.reason} {allocation.message}"
    if not allocation.cdi_devices:
        dra.release(allocation)
        raise NotApplicable("the driver injects no CDI device: it has no claim spec to leave")
    # The pod's own claim's specs, told by the devices the runtime was asked for: another
    # claim's spec (a refused pod of an earlier check, prepared late by the kubelet's retry) is
    # not this pod's to judge.
    made = wait_for(lambda: specs_declaring(dra, allocation.cdi_devices) or None, FAULT_TIMEOUT_S,
                    "the claim's CDI spec while the pod runs")  # fmt: skip
    rec.note(f"CDI files of the pod's claim: {sorted(made)}")
    dra.release(allocation)
    t0 = rec.event("pod deleted")
    wait_for(lambda: not specs_declaring(dra, allocation.cdi_devices), UNPREPARE_TIMEOUT_S,
             "no CDI spec left after the claim's unprepare")  # fmt: skip
    rec.metric("unprepared_s", rec.event("no CDI spec left") - t0)


def unprepare_retried(node: Node, rec: Recorder) -> None:
    """dra_test.go's "must retry NodeUnprepareResources after Kubelet restart" (v1.37.2): the
    unprepare of a deleted pod's claim fails (its CDI spec cannot be removed), the kubelet is
    restarted meanwhile, and the retried unprepare removes the spec: a driver that answers success
    without removing it, or never removes it, leaves it behind. Read-only CDI storage is an empty
    read-only file system over the CDI dir on every target (the seed's "read-only storage, spec
    missing"): the driver can neither remove the spec nor see it, so one that takes its absence
    for its removal also answers success, and leaves it behind once the storage is back."""
    dra = _dra(node, CAP_READ_ONLY, CAP_KUBELET_STOP)
    wait_ready(dra, rec, "before the pod")
    before = set(dra.list_files("cdi"))
    pod = dra.start_pod()
    assert pod.phase == RUNNING, f"pod refused: {pod.reason} {pod.message}"
    made = _spec_made(dra, before)
    rec.note(f"CDI files of the pod's claim: {sorted(made)}")

    def failed_or_unprepared() -> str | None:
        if dra.unprepare_failures(pod.name) > 0:
            return FAILED
        # the API drops a gracefully deleted pod only once the kubelet unprepared its claims
        return None if dra.pod_named(pod.name) is not None else UNPREPARED

    outcome = None
    dra.set_storage_read_only("cdi", True)
    try:
        rec.event("read-only CDI storage", kind=EventKind.FAULT)
        dra.request_pod_deletion(pod.name)
        t0 = rec.event(f"pod {pod.name} deleted")
        outcome = wait_for(failed_or_unprepared, UNPREPARE_TIMEOUT_S,
                           f"NodeUnprepareResources for pod {pod.name} (read-only CDI storage)")  # fmt: skip
        if outcome == FAILED:
            rec.metric("first_failure_s", rec.event("NodeUnprepareResources failed") - t0)
            dra.stop_kubelet(True)
            rec.event("kubelet stopped while the unprepare fails")
    finally:
        dra.set_storage_read_only("cdi", False)
    left = set(dra.list_files("cdi")) - before  # seen again once the storage is back
    assert outcome == FAILED, (
        f"the kubelet saw pod {pod.name}'s claim unprepared while the CDI storage was read-only: "
        f"NodeUnprepareResources answered success{f', and left {sorted(left)}' if left else ''}"
    )
    rec.event("storage writable again", kind=EventKind.REPAIRED)
    back = rec.event("kubelet started", dra.start_kubelet())
    wait_for(lambda: not (set(dra.list_files("cdi")) - before), UNPREPARE_TIMEOUT_S,
             "no CDI spec of the claim left after the kubelet's retried unprepare")  # fmt: skip
    rec.metric("unprepared_s", rec.event("no CDI spec left") - back)
    wait_for(lambda: dra.pod_named(pod.name) is None, UNPREPARE_TIMEOUT_S,
             f"pod {pod.name} gone (the kubelet saw its claim unprepared)")  # fmt: skip
    rec.event(f"pod {pod.name} gone")


def registration_socket_removed(node: Node, rec: Recorder) -> None:
    """The driver's registration socket removed from the kubelet's plugins_registry dir: the
    kubelet deregisters the driver (pluginwatcher handleDeleteEvent -> DeRegisterPlugin, v1.37.2)
    and the driver must serve a new socket and be registered again by itself (same process); a
    fresh claim pod then runs. Readiness while unregistered is recorded, not judged: the window
    may be milliseconds, and readiness tied to registration is a field report for device plugins
    (NVIDIA/k8s-device-plugin#426), not a rule of the DRA API."""
    dra = _dra(node, CAP_REGISTRATION_SOCKET)
    wait_ready(dra, rec, "before the socket is removed")
    instance = dra.plugin_instance()
    removed = dra.remove_registration_socket()
    t0 = rec.event("registration socket removed", removed, kind=EventKind.FAULT)
    unready: list[float] = []

    def registered_again() -> bool:
        if CAP_READINESS in dra.capabilities and not unready and not dra.plugin_ready():
            unready.append(rec.event("plugin unready (unregistered)", kind=EventKind.DETECTED))
        return (dra.last_registration_at() or 0.0) > removed

    wait_for(registered_again, RECOVERY_TIMEOUT_S,
             "the kubelet's registration of the driver again after its socket was removed",
             interval=0.05)  # fmt: skip
    back = rec.event("registered again", dra.last_registration_at())
    rec.metric("reregistered_s", back - t0)
    if CAP_READINESS in dra.capabilities:
        rec.note(f"readiness false {unready[0] - t0:.3f} s after the removal" if unready else
                 "readiness never seen false before the re-registration")  # fmt: skip
    assert dra.plugin_instance() == instance, "the driver was restarted, not registered again"
    wait_ready(dra, rec, "after the re-registration", since=t0)
    fresh_guest(dra, rec, "registration socket removed")
