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
    preservation,
    registration,
    restart,
)


@dataclass(frozen=True)
class Check:
    id: str
    marker: str
    title: str
    run: Callable[[Node, Recorder], None]


CATALOGUE: tuple[Check, ...] = (
    Check("guest-execution", "guest", "Real guest execution", guest.guest_execution),
    Check("cdi-missing", "cdi", "Missing CDI spec repaired", cdi.cdi_missing),
    Check("cdi-stale", "cdi", "Stale CDI spec repaired", cdi.cdi_stale),
    Check("cdi-malformed", "cdi", "Malformed CDI spec repaired", cdi.cdi_malformed),
    Check("cdi-non-regular", "cdi", "Non-regular CDI path", cdi.cdi_non_regular),
    Check("cdi-read-only", "cdi", "Read-only CDI storage", cdi.cdi_read_only),
    Check("identity-missing", "identity", "Missing host identity", identity.identity_missing),
    Check("device-unusable", "identity", "Existing unusable device", identity.device_unusable),
    Check(
        "registration-failure",
        "registration",
        "Registration failure",
        registration.registration_failure,
    ),
    Check("restart-plugin", "restart", "Plugin restart", restart.restart_plugin),
    Check("restart-kubelet", "restart", "Kubelet restart", restart.restart_kubelet),
    Check(
        "atomic-replacement",
        "atomicity",
        "Atomic replacement during allocation",
        atomicity.atomic_replacement,
    ),
    Check("preservation", "preservation", "Preservation", preservation.preservation),
)
# "cleanup" is verified by the run controller after every node is torn down.
CLEANUP = Check("cleanup", "cleanup", "Cleanup", lambda node, rec: None)

BY_ID = {c.id: c for c in (*CATALOGUE, CLEANUP)}
