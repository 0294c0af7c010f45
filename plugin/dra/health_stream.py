"""The optional DRA device-health stream (dra-health/v1 NodeWatchResources).

The kubelet opens one stream per driver that lists "v1.DRAResourceHealth" at registration; what
the driver reports becomes each pod's allocatedResourcesStatus for its claims (KEP-4680,
ResourceHealthStatus beta in v1.37), as the device plugin's ListAndWatch health does for the
extended resource. A report names a timeout: an entry the driver does not refresh within it
reads Unknown, so the stream sends the device's health on every change and at least every
`refresh_s` (v1.37.2 pkg/kubelet/cm/dra/healthinfo.go).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc

from hv_device_plugin.api import drahealth_pb2 as hp
from hv_device_plugin.api import drahealth_pb2_grpc as hp_grpc
from hv_device_plugin.health import HealthState


class DeviceHealthServicer(hp_grpc.DRAResourceHealthServicer):
    def __init__(self, pool: str, device: str, health: HealthState, refresh_s: float) -> None:
        self.pool, self.device, self.health = pool, device, health
        self.refresh_s = refresh_s
        # three refreshes may be lost before the kubelet calls the device Unknown
        self.timeout_s = max(30, int(3 * refresh_s) + 1)

    def report(self) -> hp.NodeWatchResourcesResponse:
        ok = self.health.device.ok
        return hp.NodeWatchResourcesResponse(
            devices=[
                hp.DeviceHealth(
                    device=hp.DeviceIdentifier(pool_name=self.pool, device_name=self.device),
                    health=hp.HEALTHY if ok else hp.UNHEALTHY,
                    last_updated_time=int(time.time()),
                    health_check_timeout_seconds=self.timeout_s,
                    message="" if ok else self.health.device.reason[:256],
                )
            ]
        )

    async def NodeWatchResources(
        self,
        request: hp.NodeWatchResourcesRequest,
        context: grpc.aio.ServicerContext[
            hp.NodeWatchResourcesRequest, hp.NodeWatchResourcesResponse
        ],
    ) -> AsyncIterator[hp.NodeWatchResourcesResponse]:
        while not self.health.shutting_down:
            yield self.report()
            try:
                async with asyncio.timeout(self.refresh_s):
                    await self.health.wait_change(self.health.generation)
            except TimeoutError:
                pass  # the periodic refresh
