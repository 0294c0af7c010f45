"""Both metadata phases around one node's life, with the evidence the suite records.

Usage by a target: `tp = TwoPhase("/dev/kvm")`; `tp.snapshot_original()` before the node
starts; `tp.check_startup(lookup_text)` once it is up (None for a node without udev, which must
leave the device unchanged); `tp.check_final()` after plugin testing and cleanup; then
`tp.summary()` is the `metadata-two-phase` check's evidence.
"""

from __future__ import annotations

from typing import Any

from hvconform.metadata.rules import (
    MetadataInputError,
    Snapshot,
    Verdict,
    check_final,
    check_startup,
    checked_node_gid,
    error_verdict,
    parse_group_lookup,
    snapshot,
)

CHECK_ID = "metadata-two-phase"


def _json(snap: Snapshot | None) -> dict[str, Any] | None:
    return None if snap is None else snap.to_json()


class TwoPhase:
    """Snapshots and verdicts of one device across startup and final; errors are verdicts."""

    def __init__(self, device: str = "/dev/kvm") -> None:
        self.device = device
        self.original: Snapshot | None = None
        self.node_kvm_gid: int | None = None
        self.startup_current: Snapshot | None = None
        self.startup: Verdict | None = None
        self.validated: Snapshot | None = None
        self.final_current: Snapshot | None = None
        self.final: Verdict | None = None
        # Why this process cannot check the node's device at all (the node is not on the
        # machine the suite runs on), as the target found it; "" when it can.
        self.not_here = ""

    def skip(self, why: str) -> None:
        """The node's device is not on this machine: no phase runs, and the check says why."""
        self.not_here = why

    def snapshot_original(self) -> Snapshot:
        """Before the node starts. Raises MetadataInputError when the device cannot be lstat'ed."""
        self.original = snapshot(self.device)
        return self.original

    def check_startup(self, node_kvm_gid: int | str | None = None) -> Verdict:
        """int: the node's kvm gid; str: getent-style lookup text; None: no udev, no change."""
        self.validated, self.startup_current, self.node_kvm_gid = None, None, None
        if self.original is None:
            self.startup = error_verdict("startup", "no original snapshot was taken")
            return self.startup
        try:
            if isinstance(node_kvm_gid, str):
                self.node_kvm_gid = parse_group_lookup(node_kvm_gid)
            elif node_kvm_gid is not None:
                self.node_kvm_gid = checked_node_gid(node_kvm_gid)
            self.startup_current = snapshot(self.device)
        except MetadataInputError as exc:
            # A failed lookup never turns into an accepted gid change.
            self.startup = error_verdict("startup", str(exc))
            return self.startup
        self.startup = check_startup(self.original, self.startup_current, self.node_kvm_gid)
        if self.startup.status == "accepted":
            self.validated = self.startup_current
        return self.startup

    def check_final(self) -> Verdict:
        """Against the validated snapshot, or the original when startup did not complete."""
        self.final_current = None
        if self.original is None:
            self.final = error_verdict("final", "no original snapshot was taken")
            return self.final
        try:
            self.final_current = snapshot(self.device)
        except MetadataInputError as exc:
            self.final = error_verdict("final", str(exc))
            return self.final
        self.final = check_final(self.original, self.validated, self.final_current)
        return self.final

    @property
    def passed(self) -> bool:
        return (
            self.startup is not None
            and self.startup.status == "accepted"
            and self.final is not None
            and self.final.status == "accepted"
        )

    def summary(self) -> dict[str, Any]:
        """JSON-ready evidence: both verdicts with their messages, and every snapshot."""
        return {
            "check": CHECK_ID,
            "device": self.device,
            "passed": self.passed,
            "not_here": self.not_here,
            "original": _json(self.original),
            "startup": {
                "verdict": None if self.startup is None else self.startup.to_json(),
                "node_kvm_gid": self.node_kvm_gid,
                "current": _json(self.startup_current),
            },
            "validated": _json(self.validated),
            "final": {
                "verdict": None if self.final is None else self.final.to_json(),
                "current": _json(self.final_current),
            },
        }
