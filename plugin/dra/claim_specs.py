"""One CDI spec per prepared claim, written by the device plugin's own writer.

Why per claim: NodeUnprepareResources must leave nothing of the claim behind (the e2e node
test's "no CDI spec left after a claim is unprepared"), and a runtime resolves the CDI IDs the
driver returned at container creation, long after the answer left, so the spec must be on disk,
exact and complete, before NodePrepareResources answers. The bytes come from the same
`desired_spec` and the same atomic, exact `CdiReconciler` as the device plugin's one spec; only
the CDI device name differs (`kvm-<claim uid>`), because CDI device names of one kind must be
unique across spec files.

The specs are kept, not only written: the daemon's monitor hands this object CDI-dir events and
re-checks, as it hands the device plugin's one spec to its reconciler, and every prepared
claim's spec is repaired (missing, stale, malformed, wrong mode) until its claim is unprepared.
A repair and an unprepare of the same claim are serialised, so a repair never brings back a
spec its claim's unprepare has just removed.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hv_device_plugin.cdi import CdiReconciler, CdiStatus, forget_lock
from hv_device_plugin.cdi_spec import desired_spec, qualified_name

# Claim UIDs are RFC 4122 UUIDs as the API server makes them; nothing else reaches a file name.
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
PREFIX = "hyperlight-claim-"


class ClaimSpecError(Exception):
    """The claim's spec cannot be written or removed; the message names the file and why."""


@dataclass
class ClaimSpecs:
    cdi_dir: Path
    kind: str
    device_name: str  # kvm or mshv
    device_path: str
    uid: int
    gid: int
    cdi_version: str
    # claims whose spec is kept (prepared), and what serialises a repair with a removal
    _kept: set[str] = field(default_factory=set, init=False, repr=False)
    _mutex: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def filename(self, claim_uid: str) -> str:
        if not _UID.fullmatch(claim_uid):
            raise ClaimSpecError(f"claim UID {claim_uid[:60]!r} is not a UUID")
        return f"{PREFIX}{claim_uid}.json"

    def _reconciler(self, claim_uid: str) -> CdiReconciler:
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
        return CdiReconciler(self.cdi_dir, self.filename(claim_uid), data)

    def write(self, claim_uid: str) -> list[str]:
        """Write (or repair) the claim's spec and keep it from now on; its CDI device IDs once
        the bytes are on disk."""
        with self._mutex:
            status = self._reconciler(claim_uid).reconcile()
            if not status.ok:
                raise ClaimSpecError(
                    f"CDI spec of claim {claim_uid}: {status.state}: {status.reason}"
                )
            self._kept.add(claim_uid)
        return [qualified_name(self.kind, f"{self.device_name}-{claim_uid}")]

    def keep(self, claim_uids: Iterable[str]) -> None:
        """At start: the prepared claims whose specs are kept (the driver's state file)."""
        with self._mutex:
            self._kept = set(claim_uids)

    # -- the monitor's side (hv_device_plugin.monitor.SpecKeeper) -----------------------------------------

    def watches(self, name: str) -> bool:
        return name.startswith(PREFIX) and name.endswith(".json")

    def label(self) -> str:
        return str(self.cdi_dir / f"{PREFIX}*.json")

    def memory_backed(self) -> bool:
        return self._reconciler_for_fs().memory_backed()

    def _reconciler_for_fs(self) -> CdiReconciler:
        return self._reconciler("00000000-0000-0000-0000-000000000000")

    def inspect(self) -> CdiStatus:
        return self._each(repair=False)

    def reconcile(self) -> CdiStatus:
        return self._each(repair=True)

    def _each(self, *, repair: bool) -> CdiStatus:
        """Every kept spec checked (and repaired): the first failure, else the first repair."""
        failed: CdiStatus | None = None
        repaired: CdiStatus | None = None
        for claim_uid in sorted(self._kept):
            with self._mutex:
                if claim_uid not in self._kept:
                    continue  # unprepared meanwhile: its spec is gone for good
                reconciler = self._reconciler(claim_uid)
                status = reconciler.reconcile() if repair else reconciler.inspect()
            if not status.ok and failed is None:
                failed = status
            if status.repaired and repaired is None:
                repaired = status
        return failed or repaired or CdiStatus("desired")

    def remove(self, claim_uid: str) -> None:
        """Remove the claim's spec (gone already is fine); never through a symlinked dir."""
        filename = self.filename(claim_uid)
        with self._mutex:
            self._kept.discard(claim_uid)
            forget_lock(self.cdi_dir, filename)
            self._unlink(filename)

    def _unlink(self, filename: str) -> None:
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
