"""The running DRA driver: device checks, the kubelet's two gRPC APIs, the node's ResourceSlice.

Order at start: the device is checked first (as the device plugin does before it advertises),
stray claim specs are swept, the DRAPlugin socket serves, and only then the registration socket
appears in the kubelet's plugins_registry dir: the kubelet's plugin watcher dials it at once and
the endpoint it is given must already answer. The slice is (re)published whenever the kubelet
confirms a registration (a kubelet that starts wipes its node's slices) and whenever the
device's usability changes (tainted while unusable). At SIGTERM the registration socket goes
first, so the kubelet deregisters the driver before its endpoint stops answering; the slice is
left to the kubelet, which wipes it if the driver does not come back (a rolling update must not
empty the node for the scheduler meanwhile).

While it runs, the registration socket is kept (served again if it goes: registrar.py) and the
prepared claims whose ResourceClaim is gone are unprepared by the driver itself, once at start
and then periodically (orphans.py): the kubelet would never unprepare them.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc

from hv_device_plugin import logs, shutdown
from hv_device_plugin.api import dra_pb2_grpc as dra_grpc
from hv_device_plugin.api import drahealth_pb2_grpc as drahealth_grpc
from hv_device_plugin.api.dra_wire import DRA_HEALTH_SERVICE_V1, DRA_SERVICE_V1
from hv_device_plugin.api.names import DRA_SOCKET
from hv_device_plugin.config import Config, DraConfig
from hv_device_plugin.dra.allocation import ClaimError
from hv_device_plugin.dra.claim_specs import ClaimSpecs
from hv_device_plugin.dra.claims import ClaimStore
from hv_device_plugin.dra.health_stream import DeviceHealthServicer
from hv_device_plugin.dra.kubeapi import ApiAccess, ApiError, KubeApi
from hv_device_plugin.dra.orphans import OrphanReaper
from hv_device_plugin.dra.registrar import Registrar, remove_own_socket
from hv_device_plugin.dra.service import DraServicer, RegistrationServicer
from hv_device_plugin.dra.slice import SliceFacts, resource_slice
from hv_device_plugin.endpoints import GrpcHealth, HttpEndpoints
from hv_device_plugin.health import HealthState
from hv_device_plugin.monitor import Monitor
from hv_device_plugin.probe_worker import ProbeWorker
from hv_device_plugin.version import source_commit, version

STATE_FILE = "claims.json"
PUBLISH_BACKOFF_S = (0.5, 30.0)


def registration_socket(dra: DraConfig) -> Path:
    return dra.plugins_registry_dir / f"{dra.driver_name}-reg.sock"


def _api(dra: DraConfig) -> KubeApi:
    if not dra.api_server:
        return KubeApi(ApiAccess.in_cluster())
    return KubeApi(ApiAccess(dra.api_server, dra.ca_file, dra.token_file, dra.client_cert,
                             dra.client_key))  # fmt: skip


class ClaimReader:
    """The API as a ClaimSource: a failed read is that claim's error (the kubelet retries it)."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self.api.get_claim(namespace, name)
        except (ApiError, OSError, ValueError) as exc:
            raise ClaimError(f"reading claim {namespace}/{name}: {exc}"[:500]) from None


class SlicePublisher:
    """Publishes the node's slice after each registration and each usability change."""

    def __init__(self, api: KubeApi, facts: SliceFacts, health: HealthState,
                 registration: RegistrationServicer) -> None:  # fmt: skip
        self.api, self.facts, self.health, self.reg = api, facts, health, registration
        self.generation = 0
        self.published: tuple[bool, str] | None = None  # (registered epoch seen, taint reason)
        self._wake = asyncio.Event()

    def poke(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        backoff = PUBLISH_BACKOFF_S[0]
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self.reg.registered:
                continue  # not yet (or no longer) taken by the kubelet: nothing to publish
            reason = unusable_reason(self.health)
            self.generation += 1
            body = resource_slice(self.facts, generation=self.generation, unusable_reason=reason)
            try:
                await asyncio.to_thread(self.api.apply_slice, body)
            except (ApiError, OSError) as exc:
                logs.warn("slice_publish_failed", reason=str(exc)[:300], retry_s=backoff)
                await asyncio.sleep(backoff)  # a retry's pacing, not a synchronisation
                backoff = min(backoff * 2, PUBLISH_BACKOFF_S[1])
                self._wake.set()
                continue
            backoff = PUBLISH_BACKOFF_S[0]
            logs.log("slice_published", slice=self.facts.name, generation=self.generation,
                     tainted=bool(reason))  # fmt: skip


def unusable_reason(health: HealthState) -> str:
    """Why no new claim should get the device ("" when it may): the device, or the claims'
    CDI specs that cannot be kept (a claim prepared now could not be injected either)."""
    if not health.device.ok:
        return health.device.reason
    return "" if health.cdi.ok else f"CDI: {health.cdi.reason}"


async def _follow(health: HealthState, reg: RegistrationServicer, pub: SlicePublisher) -> None:
    """Poke the publisher on each registration word and each usability change."""
    seen_device = unusable_reason(health)
    while True:
        changed = asyncio.ensure_future(reg.changed.wait())
        ticked = asyncio.ensure_future(health.wait_change(health.generation))
        await asyncio.wait([changed, ticked], return_when=asyncio.FIRST_COMPLETED)
        for task in (changed, ticked):
            task.cancel()
        if changed.done() and not changed.cancelled():
            ok = bool(reg.registered)
            health.set_registered(ok, "" if ok else (reg.error or "refused by the kubelet"))
            pub.poke()
        if bool(unusable_reason(health)) != bool(seen_device):
            seen_device = unusable_reason(health)
            pub.poke()


async def run_dra(cfg: Config, listener: socket.socket | None, worker: ProbeWorker | None) -> int:
    """Serve until SIGTERM/SIGINT; the exit code."""
    dra = cfg.dra
    assert dra is not None
    health = HealthState(streams_required=False)
    store = ClaimStore(dra.plugin_dir / STATE_FILE)
    store.load()
    specs = ClaimSpecs(cfg.cdi_dir, cfg.resource_name, cfg.device_name, cfg.hypervisor_device,
                       cfg.device_uid, cfg.device_gid, cfg.cdi_version)  # fmt: skip
    specs.keep(c.uid for c in store.all())
    # The prepared claims' specs kept exact as the device plugin's one spec is (watched,
    # re-checked, repaired); one that cannot be kept makes the driver unready and taints its
    # device, as a device plugin's unhealthy devices do.
    monitor = Monitor(cfg, health, worker, specs)
    api = _api(dra)

    async def verify() -> list[str]:
        await monitor.verify_for_allocate()
        return [] if health.device.ok else [health.device.reason]

    endpoint = dra.plugin_dir / DRA_SOCKET
    reg = RegistrationServicer(
        dra.driver_name, str(endpoint), (DRA_SERVICE_V1, DRA_HEALTH_SERVICE_V1)
    )
    servicer = DraServicer(dra.driver_name, store, specs, ClaimReader(api), verify)
    facts = SliceFacts(dra.driver_name, dra.node_name, cfg.device_name, None, cfg.slots)
    publisher = SlicePublisher(api, facts, health, reg)
    http = HttpEndpoints(health, listener) if listener is not None else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    logs.log("starting", version=version(), commit=source_commit(), mode="dra",
             driver=dra.driver_name, node=dra.node_name, device=cfg.hypervisor_device)  # fmt: skip
    server = grpc.aio.server()
    dra_grpc.add_DRAPluginServicer_to_server(servicer, server)
    # gRPC Health on the endpoint: the exec probes (`hv-device-plugin probe ... --mode dra`)
    health_pb2_grpc.add_HealthServicer_to_server(GrpcHealth(health), server)
    # the device's health for the pods holding it (allocatedResourcesStatus)
    device_health = DeviceHealthServicer(dra.node_name, cfg.device_name, health,
                                         min(cfg.recheck_interval_s, 10.0))  # fmt: skip
    drahealth_grpc.add_DRAResourceHealthServicer_to_server(device_health, server)
    registrar = Registrar(registration_socket(dra), reg)
    # prepared claims whose ResourceClaim is gone (the kubelet will never unprepare them)
    reaper = OrphanReaper(servicer, api)
    tasks: list[asyncio.Task[None]] = []
    try:
        if http is not None:
            await http.start()
        await monitor.check_all()
        swept = servicer.sweep()
        if swept:
            logs.warn("stray_claim_specs_removed", claims=swept)
        remove_own_socket(endpoint)
        server.add_insecure_port(f"unix:{endpoint}")
        await server.start()
        # the registration socket last: once it exists the kubelet may call the endpoint
        await registrar.start()
        tasks = [asyncio.ensure_future(c) for c in (monitor.run(), publisher.run(),
                                                    _follow(health, reg, publisher),
                                                    registrar.run(), reaper.run())]  # fmt: skip
        await shutdown.serve_until(stop, tasks)
        logs.log("stopping", reason="signal")
        health.shutdown()
    finally:
        registrar.unlink()  # first: the kubelet's plugin watcher deregisters the driver
        clean = await shutdown.cancel_tasks(tasks)
        clean &= await shutdown.step("stop the registration server", registrar.stop())
        clean &= await shutdown.step("stop the gRPC server", server.stop(1.0))
        with contextlib.suppress(FileNotFoundError):
            endpoint.unlink()
        if worker is not None:
            clean &= await shutdown.step("stop the probe helper", worker.close())
        if http is not None:
            clean &= await shutdown.step("stop the HTTP endpoints", http.close())
        logs.log("stopped", clean=clean)
    return 0 if clean else 3
