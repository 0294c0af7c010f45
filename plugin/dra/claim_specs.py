"""One CDI spec per prepared claim, written by the device plugin's own writer.

Why per claim: NodeUnprepareResources must leave nothing of the claim behind (the e2e node
test's "no CDI spec left after a claim is unprepared"), and a runtime resolves the CDI IDs the
driver returned at container creation, long after the answer left, so the spec must be on disk,
exact and complete, before NodePrepareResources answers. The bytes come from the same
`desired_spec` and the same atomic, exact `CdiReconciler` as the device plugin's one spec; only
the CDI device name differs (`kvm-<claim uid>`), because CDI device names of one kind must be
unique across spec files.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from plugin.cdi import CdiReconciler
from plugin.cdi_spec import desired_spec, qualified_name

# Claim UIDs are RFC 4122 UUIDs as the API server makes them; nothing else reaches a file name.
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
PREFIX = "hyperlight-claim-"


class ClaimSpecError(Exception):
    """The claim's spec cannot be written or removed; the message names the file and why."""


@dataclass(frozen=True)
class ClaimSpecs:
    cdi_dir: Path
    kind: str
    device_name: str  # kvm or mshv
    device_path: str
    uid: int
    gid: int
    cdi_version: str

    def filename(self, claim_uid: str) -> str:
        if not _UID.fullmatch(claim_uid):
            raise ClaimSpecError(f"claim UID {claim_uid[:60]!r} is not a UUID")
        return f"{PREFIX}{claim_uid}.json"

    def write(self, claim_uid: str) -> list[str]:
        """Write (or repair) the claim's spec; its CDI device IDs once the bytes are on disk."""
        name = f"{self.device_name}-{claim_uid}"
        data = desired_spec(
            kind_name=self.kind,
            device_name=self.device_name,
            device_path=self.device_path,
            uid=self.uid,
            gid=self.gid,
            cdi_version=self.cdi_version,
            cdi_name=name,
        )
        status = CdiReconciler(self.cdi_dir, self.filename(claim_uid), data).reconcile()
        if not status.ok:
            raise ClaimSpecError(f"CDI spec of claim {claim_uid}: {status.state}: {status.reason}")
        return [qualified_name(self.kind, name)]

    def remove(self, claim_uid: str) -> None:
        """Remove the claim's spec (gone already is fine); never through a symlinked dir."""
        filename = self.filename(claim_uid)
        try:
            dir_fd = os.open(self.cdi_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            raise ClaimSpecError(f"{self.cdi_dir}: {exc.strerror}") from None
        try:
            os.unlink(filename, dir_fd=dir_fd)
            os.fsync(dir_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ClaimSpecError(f"{self.cdi_dir / filename}: {exc.strerror}") from None
        finally:
            os.close(dir_fd)

    def present(self) -> list[str]:
        """Claim UIDs whose spec is in the CDI dir (the driver's start compares them with its
        state: a spec without a prepared claim is a leftover of a crash and is removed)."""
        try:
            names = [p.name for p in self.cdi_dir.iterdir()]
        except OSError:
            return []
        return sorted(
            n[len(PREFIX) : -len(".json")]
            for n in names
            if n.startswith(PREFIX) and n.endswith(".json")
        )
