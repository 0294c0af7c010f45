"""Mutant DRA driver: each claim's CDI spec is written at NodePrepareResources, and the prepared
claims' specs once at start-up (as the device plugin mutant writes its spec at start), and never
repaired afterwards: the monitor only inspects."""

from __future__ import annotations

import sys
from collections.abc import Iterable

from hv_device_plugin import __main__ as entry
from hv_device_plugin.dra.claim_specs import ClaimSpecs

_keep = ClaimSpecs.keep


def _keep_and_write(self: ClaimSpecs, claim_uids: Iterable[str]) -> None:
    uids = list(claim_uids)
    _keep(self, uids)
    for uid in uids:  # the start-up write of the state file's claims
        self.write(uid)


ClaimSpecs.keep = _keep_and_write  # type: ignore[method-assign]
ClaimSpecs.reconcile = ClaimSpecs.inspect  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(entry.main())
