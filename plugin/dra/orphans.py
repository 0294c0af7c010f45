"""Prepared claims whose ResourceClaim is gone are unprepared by the driver itself.

The kubelet calls NodeUnprepareResources only for claims in its own checkpoint. A claim can be
recorded here and never reach it: a NodePrepareResources that failed for the kubelet (a
timeout, CDI storage read-only for a while) may still have written the claim before its pod
was deleted, and a retry racing the pod's deletion can do the same. Such a claim's CDI spec
would stay for ever (and be repaired by the monitor for ever), naming a device no pod holds.

So every prepared claim is looked up by namespace/name, once at start and then periodically.
A claim the API server no longer has (404), or has under another UID (deleted and re-created
with the same name), is unprepared exactly as NodeUnprepareResources would do it, under the
same lock. This can never take a device from a running pod: the scheduler puts the
resource.kubernetes.io/delete-protection finalizer on a claim when it allocates and reserves
it, and the resourceclaim controller removes it only after the claim's reservedFor is empty,
i.e. once every pod that reserved it is done (deleted or terminal). A ResourceClaim that is gone
is therefore in no pod's use. Every other answer (an API error, a timeout, a malformed object)
keeps the claim: a claim is never removed on doubt, only retried on the next pass.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hv_device_plugin.dra.allocation import ClaimSource
from hv_device_plugin.dra.claim_specs import ClaimSpecError
from hv_device_plugin.dra.claims import ClaimStateError, PreparedClaim
from hv_device_plugin.dra.kubeapi import ApiError
from hv_device_plugin.dra.service import DraServicer
from hv_device_plugin.logs import log, warn

ORPHAN_INTERVAL_S = 30.0
# Until one pass has read every claim (the API server may come up after the driver: a node's
# reboot), passes come sooner, doubling from this up to the interval.
FIRST_RETRY_S = 1.0


class _Doubt(Exception):
    """The claim's fate cannot be decided on this pass; the message says why."""


def _orphaned(api: ClaimSource, claim: PreparedClaim) -> str:
    """Why the claim is an orphan, or "" when its ResourceClaim is still the one prepared."""
    try:
        raw: Any = api.get_claim(claim.namespace, claim.name)
    except ApiError as exc:
        if exc.status == 404:
            return "the ResourceClaim no longer exists"
        raise _Doubt(str(exc)) from None
    except (OSError, ValueError) as exc:  # the token file, a response that is not JSON
        raise _Doubt(f"reading claim {claim.namespace}/{claim.name}: {exc}") from None
    meta = raw.get("metadata") if isinstance(raw, dict) else None
    uid = meta.get("uid") if isinstance(meta, dict) else None
    if not isinstance(uid, str) or not uid:
        raise _Doubt(f"claim {claim.namespace}/{claim.name}: the answer has no metadata.uid")
    if uid != claim.uid:
        return f"the ResourceClaim was re-created (UID {uid[:40]})"
    return ""


class OrphanReaper:
    """Looks up every prepared claim; unprepares those whose ResourceClaim is gone."""

    def __init__(
        self, servicer: DraServicer, api: ClaimSource, interval_s: float = ORPHAN_INTERVAL_S
    ) -> None:
        # `api` is the bare KubeApi, not the ClaimReader NodePrepareResources reads through:
        # a 404 must stay distinguishable from every other failure.
        self.servicer, self.api, self.interval_s = servicer, api, interval_s
        self.passes = 0  # passes finished (what a test waits on)

    async def run(self) -> None:
        retry = min(FIRST_RETRY_S, self.interval_s)
        settled = False
        while True:
            doubtful = await self.reap()
            settled = settled or not doubtful
            delay = self.interval_s if settled else retry
            retry = min(retry * 2, self.interval_s)
            await asyncio.sleep(delay)  # the pacing of a periodic check, not a synchronisation

    async def reap(self) -> bool:
        """One pass over the prepared claims; True when some claim's fate stayed undecided."""
        claims = self.servicer.store.all()
        for n, claim in enumerate(claims):
            try:
                reason = await asyncio.to_thread(_orphaned, self.api, claim)
            except _Doubt as exc:
                # The rest of the pass would most likely fail the same way (the API server is
                # unreachable or refuses this driver): one warning, every claim kept.
                warn("dra_orphan_check_failed", claims_unchecked=len(claims) - n,
                     reason=str(exc)[:300], retry="next pass")  # fmt: skip
                self.passes += 1
                return True
            if reason:
                await self._unprepare(claim, reason)
        self.passes += 1
        return False

    async def _unprepare(self, claim: PreparedClaim, reason: str) -> None:
        try:
            done = await self.servicer.unprepare_orphan(claim)
        except (ClaimSpecError, ClaimStateError) as exc:
            # the same failure NodeUnprepareResources would report; the next pass tries again
            warn("dra_orphan_unprepare_failed", claim=f"{claim.namespace}/{claim.name}",
                 uid=claim.uid, reason=str(exc)[:300])  # fmt: skip
            return
        if done:
            log("dra_orphan_unprepared", claim=f"{claim.namespace}/{claim.name}",
                namespace=claim.namespace, name=claim.name, uid=claim.uid, reason=reason)  # fmt: skip
