"""The kubelet-facing gRPC services of the DRA mode: plugin registration and DRAPlugin v1.

Registration (pluginregistration.Registration, on a socket in the kubelet's plugins_registry
dir): GetInfo says what this is (type DRAPlugin, the driver name, the DRAPlugin socket, the
services it serves as "v1.DRAPlugin"); NotifyRegistrationStatus tells whether the kubelet took
it (v1.37.2 pkg/kubelet/pluginmanager/operationexecutor calls it after RegisterPlugin).

DRAPlugin (on the endpoint GetInfo names): NodePrepareResources answers, per claim, the devices
the scheduler allocated to it from this driver with their CDI device IDs, after the same
identity and usability verification an Allocate of the device plugin gets, and only once the
claim's CDI spec and the driver's state are on disk. A claim prepared before (the kubelet calls
again after its restart) gets the same answer back without a second verification: its pod is
already running with the device. NodeUnprepareResources removes the claim's spec and state.
Errors are per claim (the `error` field), never an RPC failure for the whole batch: the kubelet
retries the failed claims and keeps the prepared ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc

from hv_device_plugin.api import dra_pb2 as dra
from hv_device_plugin.api import dra_pb2_grpc as dra_grpc
from hv_device_plugin.api import pluginregistration_pb2 as reg
from hv_device_plugin.api import pluginregistration_pb2_grpc as reg_grpc
from hv_device_plugin.api.dra_wire import DRA_SERVICE_V1, PLUGIN_TYPE_DRA
from hv_device_plugin.dra.allocation import ClaimError, ClaimRef, ClaimSource, allocated_devices
from hv_device_plugin.dra.claim_specs import ClaimSpecError, ClaimSpecs
from hv_device_plugin.dra.claims import ClaimStateError, ClaimStore, PreparedClaim, PreparedDevice
from hv_device_plugin.logs import log, warn

MAX_CLAIMS = 256  # one pod's claims; the kubelet batches per pod


class RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(
        self, driver: str, endpoint: str, services: tuple[str, ...] = (DRA_SERVICE_V1,)
    ) -> None:
        self.driver, self.endpoint, self.services = driver, endpoint, services
        self.registered: bool | None = None  # the kubelet's last word, None before it spoke
        self.error = ""
        self.changed = asyncio.Event()

    async def GetInfo(
        self,
        request: reg.InfoRequest,
        context: grpc.aio.ServicerContext[reg.InfoRequest, reg.PluginInfo],
    ) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE_DRA,
            name=self.driver,
            endpoint=self.endpoint,
            supported_versions=list(self.services),
        )

    async def NotifyRegistrationStatus(
        self,
        request: reg.RegistrationStatus,
        context: grpc.aio.ServicerContext[reg.RegistrationStatus, reg.RegistrationStatusResponse],
    ) -> reg.RegistrationStatusResponse:
        self.registered, self.error = request.plugin_registered, request.error[:500]
        if request.plugin_registered:
            log("dra_registered", driver=self.driver, endpoint=self.endpoint)
        else:
            warn("dra_registration_refused", driver=self.driver, reason=self.error)
        self._announce()
        return reg.RegistrationStatusResponse()

    def lost(self, reason: str) -> None:
        """The registration socket went away: the kubelet's plugin watcher deregistered the
        driver on the delete event, so its last word no longer holds until it speaks again."""
        if self.registered is False and self.error == reason:
            return
        self.registered, self.error = False, reason
        self._announce()

    def _announce(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class DraServicer(dra_grpc.DRAPluginServicer):
    """Prepares and unprepares claims; one at a time, so the state file is never raced."""

    def __init__(
        self,
        driver: str,
        store: ClaimStore,
        specs: ClaimSpecs,
        source: ClaimSource,
        verify: Callable[[], Awaitable[list[str]]],
    ) -> None:
        self.driver, self.store, self.specs = driver, store, specs
        self.source, self.verify = source, verify
        self._lock = asyncio.Lock()

    async def NodePrepareResources(
        self,
        request: dra.NodePrepareResourcesRequest,
        context: grpc.aio.ServicerContext[
            dra.NodePrepareResourcesRequest, dra.NodePrepareResourcesResponse
        ],
    ) -> dra.NodePrepareResourcesResponse:
        if len(request.claims) > MAX_CLAIMS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"more than {MAX_CLAIMS} claims")
        answer = dra.NodePrepareResourcesResponse()
        async with self._lock:
            for claim in request.claims:
                ref = ClaimRef(claim.namespace, claim.uid, claim.name)
                one = answer.claims[claim.uid]
                try:
                    prepared = await self._prepare(ref)
                except (ClaimError, ClaimSpecError, ClaimStateError) as exc:
                    one.error = str(exc)[:1000]
                    warn("dra_prepare_refused", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid,
                         reason=one.error)  # fmt: skip
                    continue
                for device in prepared.devices:
                    answer_device = dra.Device(
                        request_names=list(device.request_names),
                        pool_name=device.pool,
                        device_name=device.device,
                        cdi_device_ids=list(device.cdi_ids),
                    )
                    if device.share_id:  # the kubelet keys a shared device's health by it
                        answer_device.share_id = device.share_id
                    one.devices.append(answer_device)
        return answer

    async def _prepare(self, ref: ClaimRef) -> PreparedClaim:
        known = self.store.get(ref.uid)
        if known is not None:
            # already prepared (a kubelet restart asks again): make sure the spec is still
            # exact, answer the same
            await asyncio.to_thread(self.specs.write, ref.uid)
            return known
        reasons = await self.verify()
        if reasons:
            raise ClaimError("device not usable: " + "; ".join(reasons))
        raw = await asyncio.to_thread(self.source.get_claim, ref.namespace, ref.name)
        allocated = allocated_devices(raw, ref, self.driver)
        cdi_ids = tuple(await asyncio.to_thread(self.specs.write, ref.uid))
        by_device: dict[tuple[str, str, str], list[str]] = {}
        for a in allocated:  # one entry per device (and share), naming every request it serves
            by_device.setdefault((a.pool, a.device, a.share_id), []).append(a.request)
        claim = PreparedClaim(
            ref.uid,
            ref.namespace,
            ref.name,
            tuple(
                PreparedDevice(tuple(reqs), pool, device, cdi_ids, share)
                for (pool, device, share), reqs in by_device.items()
            ),
        )
        self.store.put(claim)  # on disk before the answer leaves
        log("dra_prepared", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid, cdi=list(cdi_ids))
        return claim

    async def NodeUnprepareResources(
        self,
        request: dra.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[
            dra.NodeUnprepareResourcesRequest, dra.NodeUnprepareResourcesResponse
        ],
    ) -> dra.NodeUnprepareResourcesResponse:
        if len(request.claims) > MAX_CLAIMS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"more than {MAX_CLAIMS} claims")
        answer = dra.NodeUnprepareResourcesResponse()
        async with self._lock:
            for claim in request.claims:
                one = answer.claims[claim.uid]
                try:
                    await asyncio.to_thread(self.specs.remove, claim.uid)
                    self.store.remove(claim.uid)
                except (ClaimSpecError, ClaimStateError) as exc:
                    one.error = str(exc)[:1000]
                    warn("dra_unprepare_failed", uid=claim.uid, reason=one.error)
                    continue
                log("dra_unprepared", claim=f"{claim.namespace}/{claim.name}", uid=claim.uid)
        return answer

    async def unprepare_orphan(self, claim: PreparedClaim) -> bool:
        """Unprepare a claim the kubelet will never unprepare (its ResourceClaim is gone),
        under the lock its own calls take; False when the kubelet changed it meanwhile."""
        async with self._lock:
            if self.store.get(claim.uid) != claim:
                return False  # unprepared by the kubelet between the check and now
            await asyncio.to_thread(self.specs.remove, claim.uid)
            self.store.remove(claim.uid)
        return True

    def sweep(self) -> list[str]:
        """At start: remove claim specs that no prepared claim owns (a crash between writing a
        spec and recording the claim); returns their claim UIDs."""
        owned = {c.uid for c in self.store.all()}
        stray = [uid for uid in self.specs.present() if uid not in owned]
        for uid in stray:
            self.specs.remove(uid)
        return stray
