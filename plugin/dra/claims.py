"""Claims this driver prepared, kept on disk so that they survive driver and kubelet restarts.

The kubelet calls NodePrepareResources again for every claim of a running pod after it restarts,
and NodeUnprepareResources only once the pod is gone; a driver restart in between must answer
both from what it prepared before (v1.37.2 pkg/kubelet/cm/dra/manager.go keeps its own
checkpoint of prepared claims and calls the driver again for them). So every prepared claim is
written down before its answer leaves, and prepare is idempotent: the same claim UID gets the
same devices and CDI IDs back.

The file lives in the driver's own plugin dir (a hostPath the driver alone writes); it is
replaced atomically (a temporary file made with O_EXCL|O_NOFOLLOW in the same directory, fsynced,
renamed over the old one, the directory fsynced), so a crash leaves the old or the new state,
never a torn one, and a planted symlink is never followed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = 1
MAX_BYTES = 4 << 20  # thousands of claims; a larger file is not this driver's


class ClaimStateError(Exception):
    """The state file cannot be read or written; the message names it and why."""


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str = ""  # the allocation's shareID of a shared device (consumable capacity)

    def to_json(self) -> dict[str, Any]:
        return {
            "requestNames": list(self.request_names),
            "pool": self.pool,
            "device": self.device,
            "cdiDeviceIDs": list(self.cdi_ids),
            "shareID": self.share_id,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PreparedDevice:
        return cls(
            tuple(str(n) for n in raw["requestNames"]),
            str(raw["pool"]),
            str(raw["device"]),
            tuple(str(i) for i in raw["cdiDeviceIDs"]),
            str(raw.get("shareID", "")),
        )


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "devices": [d.to_json() for d in self.devices],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PreparedClaim:
        return cls(
            str(raw["uid"]),
            str(raw["namespace"]),
            str(raw["name"]),
            tuple(PreparedDevice.from_json(d) for d in raw["devices"]),
        )


class ClaimStore:
    """Prepared claims by UID; every change is on disk before the call returns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._claims: dict[str, PreparedClaim] = {}

    def load(self) -> None:
        """Read the state a previous run left; a missing file is an empty state."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            self._claims = {}
            return
        except OSError as exc:
            raise ClaimStateError(f"{self.path}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise ClaimStateError(f"{self.path}: larger than {MAX_BYTES} bytes")
        try:
            raw = json.loads(data)
            if raw.get("schema") != SCHEMA:
                raise ValueError(f"schema {raw.get('schema')!r:.20}, expected {SCHEMA}")
            claims = [PreparedClaim.from_json(c) for c in raw["claims"]]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ClaimStateError(f"{self.path}: not a claim state file ({exc})"[:300]) from None
        self._claims = {c.uid: c for c in claims}

    def get(self, uid: str) -> PreparedClaim | None:
        return self._claims.get(uid)

    def all(self) -> list[PreparedClaim]:
        return sorted(self._claims.values(), key=lambda c: c.uid)

    def put(self, claim: PreparedClaim) -> None:
        claims = {**self._claims, claim.uid: claim}
        self._write(claims)
        self._claims = claims

    def remove(self, uid: str) -> None:
        if uid not in self._claims:
            return
        claims = {k: v for k, v in self._claims.items() if k != uid}
        self._write(claims)
        self._claims = claims

    def _write(self, claims: dict[str, PreparedClaim]) -> None:
        body = {"schema": SCHEMA, "claims": [claims[k].to_json() for k in sorted(claims)]}
        data = json.dumps(body, indent=1, sort_keys=True).encode() + b"\n"
        directory = self.path.parent
        tmp = f".{self.path.name}.{secrets.token_hex(6)}.tmp"
        try:
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            raise ClaimStateError(f"{directory}: {exc.strerror}") from None
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.rename(tmp, self.path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dir_fd)
                raise
            os.fsync(dir_fd)
        except OSError as exc:
            raise ClaimStateError(f"{self.path}: {exc.strerror}") from None
        finally:
            os.close(dir_fd)
