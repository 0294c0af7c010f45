"""The scenario catalogue: every check once, by stable id. Knows nothing of targets or pytest."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from conformance.contract.node import Node
from conformance.contract.results import Recorder
from conformance.scenarios import (
    atomicity,
    cdi,
    guest,
    identity,
    late,
    options,
    preservation,
    reboot,
    registration,
    restart,
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


CATALOGUE: tuple[Check, ...] = (
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
)  # fmt: skip
# "cleanup" is verified by the run controller after every node is torn down.
CLEANUP = Check(
    "cleanup",
    "cleanup",
    "Cleanup",
    lambda node, rec: None,
    "the owner ledger: every process, mount, namespace and dir the run created is gone",
)


def readme_table() -> str:
    """The README's table of checks, generated from the catalogue (a test keeps them equal)."""
    rows = ["| id | marker | level | what must hold |", "| --- | --- | --- | --- |"]
    rows += [
        f"| {c.id} | {c.marker} | {c.level} | {c.requirement} |" for c in (*CATALOGUE, CLEANUP)
    ]
    return "\n".join(rows) + "\n"


BY_ID = {c.id: c for c in (*CATALOGUE, CLEANUP)}
