"""The scenario catalogue: every check once, by stable id. Knows nothing of targets or pytest."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from hvconform.contract.dra_profile import API_DEVICE_PLUGIN, API_DRA
from hvconform.contract.node import Node
from hvconform.contract.results import Recorder
from hvconform.scenarios import (
    atomicity,
    cdi,
    dra,
    guest,
    health_restart,
    identity,
    late,
    options,
    preservation,
    reboot,
    registration,
    restart,
    validate,
    workloads,
)


@dataclass(frozen=True)
class Check:
    id: str
    marker: str
    title: str
    run: Callable[[Node, Recorder], None]
    requirement: str  # what must hold: the seed's requirement, in the README's table
    level: str = "seed"  # "seed": the seed's live checks; "extended": stricter than the seed
    # The plugin APIs the check judges: a check of the other API ends not_applicable (a DRA
    # driver has no ListAndWatch stream to lose; a device plugin no ResourceSlice).
    apis: tuple[str, ...] = (API_DEVICE_PLUGIN,)
    # How binding it is (RFC 2119 words): "MUST", the kubelet's contract, whose breaking loses
    # or refuses workloads; "SHOULD", a practice (a failure shown apart: fix after the MUSTs).
    # `requirement_source` names the kubelet code path or the seed sentence it rests on.
    requirement_level: str = ""
    requirement_source: str = ""
    # In the validate subset (`hvconform run --mode validate`): the check disturbs nothing on a
    # serving node (no fault, nothing of the plugin's written, at most one free slot taken for
    # one guest and given back), so it may run where workloads run. Every other row needs a node
    # the run may disturb (its own, or one cordoned for conformance).
    validate: bool = False


DP = (API_DEVICE_PLUGIN,)
BOTH = (API_DEVICE_PLUGIN, API_DRA)
DRA = (API_DRA,)


CATALOGUE: tuple[Check, ...] = (
    Check("validate-device", "validate", "Device as reported", validate.device_reported,
          "capacity > 0, allocatable > 0 within the kubelet's status period, the plugin ready "
          "and alive as the kubelet judges: both views agree", apis=BOTH, validate=True),
    Check("validate-cdi-spec", "validate", "CDI spec exact, read only", validate.cdi_spec_exact,
          "the owned spec a regular file, unchanged since setup, one vendor/class kind, its "
          "device nodes the node's real numbers", validate=True),
    Check("validate-guest", "validate", "Guest on a free slot", validate.guest_on_free_slot,
          "one free slot: its CDI devices defined by the spec, a real guest runs, the slot is "
          "free again (no free slot: not judged)", apis=BOTH, validate=True),
    Check("guest-execution", "guest", "Real guest execution", guest.guest_execution,
          "repeated real guest runs through allocations, fresh after disposal"),
    Check("cdi-missing", "cdi", "Missing CDI spec repaired", cdi.cdi_missing,
          "spec byte-exact again (recovery measured), then a fresh guest"),
    Check("cdi-stale", "cdi", "Stale CDI spec repaired", cdi.cdi_stale,
          "spec byte-exact again (recovery measured), then a fresh guest"),
    Check("cdi-malformed", "cdi", "Malformed CDI spec repaired", cdi.cdi_malformed,
          "spec byte-exact again (recovery measured), then a fresh guest"),
    Check("cdi-non-regular", "cdi", "Non-regular CDI path", cdi.cdi_non_regular,
          "directory at the spec path: not ready, allocatable 0; removed: recovers, same process"),
    Check("cdi-read-only", "cdi", "Read-only CDI storage", cdi.cdi_read_only,
          "read-only storage, spec missing: live, not ready, Allocate refused; restored: recovers"),
    Check("identity-missing", "identity", "Missing host identity", identity.identity_missing,
          "device gone from where the plugin looks: allocatable 0, capacity kept; back: recovers"),
    Check("device-unusable", "identity", "Existing unusable device", identity.device_unusable,
          "/dev/null's node at the kvm path with matching identity: Allocate refused"),
    Check("device-late", "identity", "Device appears after the plugin", late.device_late,
          "started with its device absent: alive, nothing healthy, not ready; device appears: "
          "healthy, ready and a guest runs, no restart", level="extended"),
    Check("registration-failure", "registration", "Registration failure",
          registration.registration_failure,
          "started into an isolated empty socket dir: not ready, no busy loop; restored: registers"),
    Check("registration-dir-replaced", "registration", "Socket dir replaced while registered",
          registration.registration_dir_replaced,
          "empty dir over the socket dir of a registered plugin: not ready, no busy loop; "
          "restored: registers again", level="extended"),
    Check("stream-lost", "registration", "ListAndWatch ended by the kubelet", late.stream_lost,
          "the kubelet ends the stream and disconnects the plugin: it registers again, "
          "allocatable back (time measured), no restart", level="extended"),
    Check("optional-rpcs", "options", "Declared optional RPCs", options.optional_rpcs,
          "GetPreferredAllocation / PreStartContainer, when declared: honoured on admission",
          level="extended"),
    Check("restart-plugin", "restart", "Plugin restart", restart.restart_plugin,
          "plugin replaced: registered again; a running guest keeps counting"),
    Check("restart-kubelet", "restart", "Kubelet restart", restart.restart_kubelet,
          "graceful and crash kubelet restarts: re-registration time measured"),
    Check("health-after-kubelet-restart", "restart", "Device health after kubelet restarts",
          health_restart.health_after_kubelet_restart,
          "after a graceful and after a crash kubelet restart, device gone: allocatable 0; back: "
          "allocatable again, each within the bound (the new stream carries it)",
          level="extended"),
    Check("workloads-survive-kubelet-restart", "workloads", "Workloads survive kubelet restarts",
          workloads.workloads_survive_kubelet_restart,
          "graceful and crash restarts: same pods (UID, container, restarts) running and "
          "counting, same device IDs in pod-resources, no admission error", level="extended"),
    Check("health-in-pod-status", "workloads", "Device health in pod status",
          workloads.health_in_pod_status,
          "device gone: the pod's allocatedResourcesStatus says Unhealthy; back: Healthy, the "
          "pod kept running", level="extended"),
    Check("rollout-safety", "restart", "Plugin DaemonSet rollout", restart.rollout_safety,
          "DaemonSet rolled, same code: running guests keep counting, every guest admitted "
          "meanwhile runs, allocatable back to capacity", level="extended"),
    Check("atomic-replacement", "atomicity", "Atomic replacement during allocation",
          atomicity.atomic_replacement,
          "readers during allocation-triggered repair: zero torn reads, zero errors"),
    Check("preservation", "preservation", "Preservation", preservation.preservation,
          "sentinel CDI files and host /dev/kvm metadata unchanged; session guest kept state"),
    # After preservation: a reboot ends every workload, the session guest's too.
    Check("node-reboot", "workloads", "Node reboot", reboot.node_reboot,
          "kubelet and sandboxes gone, both back, device late: registration time and refused "
          "requests measured; nothing admitted or healthy while unusable; the controller's "
          "workload runs again; no stale checkpoint entry", level="extended"),
    # DRA: what the kubelet's own node tests check of a DRA driver (test/e2e_node/dra_test.go).
    Check("dra-kubelet-restart", "restart", "DRA: kubelet restarts with a prepared claim",
          dra.kubelet_restart,
          "a pod holding a prepared claim keeps running and counting across graceful and crash "
          "kubelet restarts; the driver republishes its ResourceSlice after the kubelet's "
          "start-up wipe (republish measured)",
          level="extended", apis=DRA),
    Check("dra-pod-while-kubelet-down", "restart", "DRA: pod created while the kubelet is down",
          dra.pod_while_kubelet_down,
          "a pod allocated while the kubelet is down runs once the kubelet is back",
          level="extended", apis=DRA),
    Check("dra-prepare-retried", "cdi", "DRA: NodePrepareResources retried",
          dra.prepare_retried,
          "the claim's spec cannot be written (read-only CDI storage): prepare fails, is retried "
          "across a kubelet restart, and the pod runs once storage is back",
          level="extended", apis=DRA),
    Check("dra-shared-device", "guest", "DRA: one device shared by several pods",
          dra.shared_device,
          "a shareable device (allowMultipleAllocations) serves 3 pods at once, each with its "
          "own claim and CDI spec, every guest running; not shareable: not applicable",
          level="extended", apis=DRA),
    Check("dra-no-spec-left", "cdi", "DRA: no CDI spec left after unprepare", dra.no_spec_left,
          "the pod deleted: its claim unprepared and no CDI spec of it left",
          level="extended", apis=DRA),
    Check("dra-unprepare-retried", "cdi", "DRA: NodeUnprepareResources retried",
          dra.unprepare_retried,
          "the pod deleted while its claim's spec cannot be removed (read-only CDI storage): "
          "unprepare fails, is retried across a kubelet restart, and no spec is left (measured)",
          level="extended", apis=DRA),
    Check("dra-registration-socket-removed", "registration",
          "DRA: registration socket removed", dra.registration_socket_removed,
          "the driver's socket removed from plugins_registry: the driver serves a new one and is "
          "registered again by itself (measured), ready, and a fresh claim pod runs",
          level="extended", apis=DRA),
    Check("validate-metadata", "validate", "Hypervisor device metadata",
          validate.hypervisor_metadata,
          "the node's hypervisor device a character device whose type, numbers, mode and owner "
          "are as at the run's start", apis=BOTH, validate=True),
)  # fmt: skip
# Checks of the catalogue that judge a DRA driver too (through the same Node observations:
# hvconform.contract.dra says what each one means there).
_JUDGES_BOTH = {"guest-execution", "cdi-missing", "cdi-stale", "cdi-malformed", "cdi-non-regular",
                "cdi-read-only", "identity-missing", "device-unusable", "restart-plugin",
                "preservation"}  # fmt: skip
CATALOGUE = tuple(
    dataclasses.replace(c, apis=BOTH) if c.id in _JUDGES_BOTH else c for c in CATALOGUE
)
MUST, SHOULD = "MUST", "SHOULD"
_CDI = "containerd/CRI-O fail container creation for a CDI device whose spec does not resolve"
# Every row's requirement level and its source (a test keeps every catalogue row named here).
_LEVELS: dict[str, tuple[str, str]] = {
    "validate-device": (MUST, "the kubelet admits pods onto every device listed Healthy; a "
                        "plugin's readiness that disagrees misleads every rollout gate"),
    "validate-cdi-spec": (MUST, f"{_CDI}; the seed: the spec names the real device"),
    "validate-guest": (MUST, "the seed: a workload granted the device runs a real guest "
                       "through it; a released device is allocatable again (devicemanager)"),
    "validate-metadata": (MUST, "the seed: the host's /dev/kvm metadata is never changed"),
    "guest-execution": (MUST, "the seed: a workload granted the device runs a real guest through "
                        "it; the kubelet's Allocate answer is what the runtime injects"),
    "cdi-missing": (MUST, _CDI),
    "cdi-stale": (MUST, _CDI),
    "cdi-malformed": (MUST, _CDI),
    "cdi-non-regular": (MUST, f"{_CDI}; the kubelet admits pods onto every healthy device"),
    "cdi-read-only": (MUST, "the seed: Allocate is refused while the spec cannot be written, "
                      "never answered with a device the runtime cannot resolve"),
    "identity-missing": (MUST, "the kubelet admits pods onto every device listed Healthy "
                         "(devicemanager allocatable): a vanished device must not be"),
    "device-unusable": (MUST, "the seed: never allocate a device that is not really usable"),
    "device-late": (MUST, "the kubelet admits pods onto every device listed Healthy: nothing "
                    "before the device exists, and it must come without a restart by hand "
                    "(kubevirt/kubevirt#4748)"),
    "registration-failure": (MUST, "the kubelet serves a resource only after Register "
                             "(devicemanager/plugin/v1beta1 server.go)"),
    "registration-dir-replaced": (MUST, "the kubelet serves a resource only after Register; a "
                                  "plugin whose socket is gone must register again"),
    "stream-lost": (MUST, "v1.37 client.go Run returns and handler.go runClient disconnects the "
                    "endpoint: only a new Register brings the devices back"),
    "optional-rpcs": (MUST, "the kubelet calls GetPreferredAllocation and PreStartContainer "
                      "when the plugin's options declare them (manager.go)"),
    "restart-plugin": (MUST, "the seed: a replaced plugin registers again; running workloads "
                       "keep their device"),
    "restart-kubelet": (MUST, "a starting kubelet removes every socket in device-plugins "
                        "(manager.go Start): the plugin must register again"),
    "health-after-kubelet-restart": (MUST, "the kubelet admits pods onto the devices the live "
                                     "ListAndWatch stream lists Healthy: a health change after "
                                     "a restart must reach the new stream"),
    "workloads-survive-kubelet-restart": (MUST, "kubernetes/kubernetes#118559 and the kubelet's "
                                          "e2e 'Keeps device plugin assignments across kubelet "
                                          "restarts'"),
    "health-in-pod-status": (SHOULD, "a practice: keep a vanished device listed as Unhealthy so "
                             "the pod's allocatedResourcesStatus can show it (KEP-4680)"),
    "rollout-safety": (MUST, "an upgrade must not lose running workloads nor admit one onto a "
                       "device that is not usable"),
    "atomic-replacement": (MUST, f"the seed: the spec is replaced atomically; {_CDI}"),
    "preservation": (MUST, "the seed: unrelated CDI files and the host's /dev/kvm metadata are "
                     "never changed"),
    "node-reboot": (MUST, "the kubelet admits pods onto every device listed Healthy: nothing "
                    "while the device is unusable after a reboot, the workload back once it is"),
    "dra-kubelet-restart": (MUST, "test/e2e_node/dra_test.go: a prepared claim's pod keeps "
                            "running across kubelet restarts; the starting kubelet wipes slices"),
    "dra-pod-while-kubelet-down": (MUST, "test/e2e_node/dra_test.go: a pod allocated while the "
                                   "kubelet is down runs once it is back"),
    "dra-prepare-retried": (MUST, "test/e2e_node/dra_test.go: a failed NodePrepareResources is "
                            "retried and the pod runs"),
    "dra-shared-device": (MUST, "a device published with allowMultipleAllocations must serve "
                          "every claim the scheduler allocates it to"),
    "dra-no-spec-left": (MUST, f"NodeUnprepareResources removes the claim's spec; {_CDI}"),
    "dra-unprepare-retried": (MUST, "test/e2e_node/dra_test.go: a failed "
                              "NodeUnprepareResources is retried"),
    "dra-registration-socket-removed": (SHOULD, "a practice: the kubelet does not re-register a "
                                        "driver whose plugins_registry socket vanished; the "
                                        "driver serves a new one itself"),
}  # fmt: skip
CATALOGUE = tuple(
    dataclasses.replace(c, requirement_level=_LEVELS[c.id][0], requirement_source=_LEVELS[c.id][1])
    if c.id in _LEVELS
    else c
    for c in CATALOGUE
)
# "cleanup" is verified by the run controller after every node is torn down.
CLEANUP = Check(
    "cleanup",
    "cleanup",
    "Cleanup",
    lambda node, rec: None,
    "the owner ledger: every process, mount, namespace and dir the run created is gone",
    apis=BOTH,
)


VALIDATE_MARK = "validate"  # the pytest mark every row of the validate subset carries


def judging(api: str) -> tuple[Check, ...]:
    """The checks of a run whose plugin speaks `api`, in catalogue order."""
    return tuple(c for c in CATALOGUE if api in c.apis)


def readme_table() -> str:
    """The README's table of checks, generated from the catalogue (a test keeps them equal)."""
    rows = [
        "| id | marker | level | validate | API | what must hold |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    rows += [
        f"| {c.id} | {c.marker} | {c.level} | {'yes' if c.validate else ''} | "
        f"{', '.join(c.apis)} | {c.requirement} |"
        for c in (*CATALOGUE, CLEANUP)
    ]
    return "\n".join(rows) + "\n"


BY_ID = {c.id: c for c in (*CATALOGUE, CLEANUP)}
