"""Pod admission against one device plugin resource, as the kubelet's device manager does it.

Device choice (devicesToAllocate without topology hints): free healthy IDs; if the plugin
advertised it, GetPreferredAllocation(available = free healthy, must_include = [], size),
answer intersected with the available set, shortfall filled by the kubelet. Then Allocate
with one ContainerAllocateRequest, PreStartContainer if required. No retries.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from hv_device_plugin.api import deviceplugin_pb2 as pb

from .accounting import Accounting, AllocationRecord, EventKind
from .client import EndpointError, PluginEndpoint

PHASE_RUNNING = "Running"
PHASE_PENDING = "Pending"
PHASE_FAILED = "Failed"
REASON_ADMISSION = "UnexpectedAdmissionError"
# The real kubelet rejects an over-request earlier (predicate admission, reason
# "OutOf<resource>"); the emulator has no scheduler, so it names the cause directly.
REASON_INSUFFICIENT = "InsufficientResources"
# A failed PreStartContainer keeps the container from being created; the pod stays Pending.
REASON_PRESTART = "CreateContainerConfigError"
# How the kubelet's %v renders an AllocateResponse that has no container responses.
_EMPTY_RESPONSE = "&AllocateResponse{ContainerResponses:[]*ContainerAllocateResponse{},}"


@dataclass(frozen=True)
class AllocationOutcome:
    """Result of admitting one container that requests `count` devices of one resource."""

    ok: bool
    phase: str
    reason: str
    message: str
    resource: str
    container: str
    device_ids: tuple[str, ...] = ()
    allocation: AllocationRecord | None = None
    preferred: tuple[str, ...] | None = None  # the plugin's raw GetPreferredAllocation answer

    @property
    def response(self) -> pb.ContainerAllocateResponse | None:
        return None if self.allocation is None else self.allocation.response


def admission_error(err: str) -> str:
    """The pod status message of a failed admission."""
    # The real kubelet (v1.37.2, found by the differential test in tests/realnode) prefixes the
    # admission message with "Pod was rejected: ".
    return f"Pod was rejected: Allocate failed due to {err}, which is unexpected"


class Admission:
    """Allocates devices for containers, one admission at a time."""

    def __init__(
        self,
        accounting: Accounting,
        endpoint_of: Callable[[str], PluginEndpoint | None],
        persist: Callable[[], None],
        prestart_timeout_s: float,
    ) -> None:
        self._accounting = accounting
        self._endpoint_of = endpoint_of
        self._persist = persist
        self._prestart_timeout_s = prestart_timeout_s
        self._lock = asyncio.Lock()  # the kubelet admits pods sequentially

    async def allocate(
        self,
        resource: str,
        count: int = 1,
        container: str = "c0",
        *,
        pod_uid: str | None = None,
        rpc_timeout_s: float | None = None,
    ) -> AllocationOutcome:
        """Admit one container asking for `count` devices of `resource`."""
        if count < 1:
            raise ValueError(f"a container requests at least one device, not {count}")
        async with self._lock:
            return await self._allocate(
                resource, count, container, pod_uid or str(uuid.uuid4()), rpc_timeout_s
            )

    async def _allocate(
        self,
        resource: str,
        count: int,
        container: str,
        pod_uid: str,
        rpc_timeout_s: float | None,
    ) -> AllocationOutcome:
        acct = self._accounting

        def failed(reason: str, message: str, phase: str = PHASE_FAILED) -> AllocationOutcome:
            acct.record(EventKind.ALLOCATION_FAILED, resource, reason=reason, message=message)
            return AllocationOutcome(False, phase, reason, message, resource, container)

        free = sorted(acct.state(resource).healthy - acct.in_use(resource))
        if count > len(free):
            return failed(
                REASON_INSUFFICIENT,
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {count}, Available: {len(free)}",
            )
        ep = self._endpoint_of(resource)
        if ep is None:
            return failed(REASON_ADMISSION, admission_error(f"unknown Device Plugin {resource}"))
        chosen: list[str] = []
        preferred: tuple[str, ...] | None = None
        if ep.options is not None and ep.options.get_preferred_allocation_available:
            try:
                preferred = tuple(await ep.preferred_allocation(free, [], count))
            except EndpointError as err:
                text = f"device plugin GetPreferredAllocation rpc failed with err: {err}"
                return failed(REASON_ADMISSION, admission_error(text))
            available = set(free)
            for dev in preferred:
                if dev in available and dev not in chosen and len(chosen) < count:
                    chosen.append(dev)
        for dev in free:
            if len(chosen) >= count:
                break
            if dev not in chosen:
                chosen.append(dev)
        acct.reserve(resource, chosen)
        try:
            answer = await ep.allocate(chosen, rpc_timeout_s)
        except EndpointError as err:
            acct.unreserve(resource, chosen)
            return failed(REASON_ADMISSION, admission_error(str(err)))
        except BaseException:
            acct.unreserve(resource, chosen)
            raise
        if not answer.container_responses:
            acct.unreserve(resource, chosen)
            text = f"no containers return in allocation response {_EMPTY_RESPONSE}"
            return failed(REASON_ADMISSION, admission_error(text))
        # Only the first container response is used, however many the plugin sent.
        record = acct.add_allocation(
            pod_uid, container, resource, chosen, answer.container_responses[0]
        )
        self._persist()
        ids = tuple(chosen)
        if ep.options is not None and ep.options.pre_start_required:
            try:
                await ep.pre_start(chosen, self._prestart_timeout_s)
            except EndpointError as err:
                message = f"device plugin PreStartContainer rpc failed with err: {err}"
                acct.record(EventKind.ALLOCATION_FAILED, resource, reason=REASON_PRESTART)
                return AllocationOutcome(
                    False, PHASE_PENDING, REASON_PRESTART, message, resource, container,
                    ids, record, preferred,
                )  # fmt: skip
        return AllocationOutcome(
            True, PHASE_RUNNING, "", "", resource, container, ids, record, preferred
        )

    def release(self, allocation: AllocationRecord | int) -> bool:
        """The container ended: its devices are free again."""
        alloc_id = allocation if isinstance(allocation, int) else allocation.alloc_id
        released = self._accounting.release(alloc_id) is not None
        if released:
            self._persist()
        return released
