"""The DRA mode's kubelet-facing services over real gRPC on unix sockets (issue 28, first part).

What is judged, with the source of each requirement:
- GetInfo is what the v1.37.2 kubelet's plugin watcher validates: type DRAPlugin, the driver
  name, the DRAPlugin endpoint and "v1.DRAPlugin" among the supported services
  (pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go validateSupportedServices);
- NodePrepareResources answers only this driver's allocation results, with CDI IDs whose spec is
  on disk with the exact bytes before the answer; a claim re-created under the same name (other
  UID) or an unusable device is a per-claim error and writes nothing;
- a prepared claim survives a driver restart (the kubelet asks again after its own restart and
  gets the same answer) and NodeUnprepareResources leaves no CDI spec behind (test/e2e_node/
  dra_test.go); a spec no claim owns (a crash between the two writes) is swept at start.

The claim objects come from an in-process source here: the API-server client that reads them
on a node is judged against a real API server with the driver's live checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from hv_device_plugin.api import dra_pb2 as dra
from hv_device_plugin.api import dra_pb2_grpc as dra_grpc
from hv_device_plugin.api import pluginregistration_pb2 as reg
from hv_device_plugin.api import pluginregistration_pb2_grpc as reg_grpc
from hv_device_plugin.api.names import CDI_KIND
from hv_device_plugin.cdi_spec import desired_spec
from hv_device_plugin.dra.claim_specs import ClaimSpecs
from hv_device_plugin.dra.claims import ClaimStateError, ClaimStore, PreparedClaim
from hv_device_plugin.dra.service import DraServicer, RegistrationServicer

DRIVER = "hypervisor.hyperlight.dev"


class Claims:
    """ResourceClaim objects by (namespace, name), as the API server would return them."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0

    def add(self, name: str, results: list[dict[str, str]], uid: str = "") -> str:
        uid = uid or str(uuid.uuid4())
        self.objects[("ns", name)] = {
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }
        return uid

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        return self.objects[(namespace, name)]


class Driver:
    def __init__(self, root: Path, claims: Claims) -> None:
        self.cdi = root / "cdi"
        self.cdi.mkdir(exist_ok=True)
        self.state = root / "state.json"
        self.claims = claims
        self.reasons: list[str] = []
        self.specs = ClaimSpecs(self.cdi, CDI_KIND, "kvm", "/dev/kvm", 65534, 65534, "0.5.0")

    def servicer(self) -> DraServicer:
        store = ClaimStore(self.state)
        store.load()

        async def verify() -> list[str]:
            return list(self.reasons)

        return DraServicer(DRIVER, store, self.specs, self.claims, verify)


@pytest.fixture
def short() -> Iterator[Path]:
    """A short root: unix socket paths must fit in 107 bytes (tmp_path's do not always)."""
    root = Path(tempfile.mkdtemp(prefix="hvd-", dir="/tmp"))
    yield root
    shutil.rmtree(root)


@contextlib.asynccontextmanager
async def served(driver: Driver) -> AsyncIterator[dra_grpc.DRAPluginStub]:
    server = grpc.aio.server()
    dra_grpc.add_DRAPluginServicer_to_server(driver.servicer(), server)
    sock = driver.cdi.parent / "dra.sock"
    server.add_insecure_port(f"unix:{sock}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{sock}") as channel:
            yield dra_grpc.DRAPluginStub(channel)
    finally:
        await server.stop(None)


def _claim(uid: str, name: str) -> dra.Claim:
    return dra.Claim(namespace="ns", uid=uid, name=name)


def _ours(request: str = "hv", device: str = "kvm") -> dict[str, str]:
    return {"request": request, "driver": DRIVER, "pool": "node-a", "device": device}


def test_getinfo_is_what_the_kubelet_validates(short: Path) -> None:
    asyncio.run(_getinfo(short))


async def _getinfo(tmp_path: Path) -> None:
    servicer = RegistrationServicer(DRIVER, str(tmp_path / "dra.sock"))
    server = grpc.aio.server()
    reg_grpc.add_RegistrationServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{tmp_path / 'reg.sock'}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{tmp_path / 'reg.sock'}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(reg.InfoRequest())
            assert (info.type, info.name, info.endpoint) == (
                "DRAPlugin",
                DRIVER,
                str(tmp_path / "dra.sock"),
            )
            assert list(info.supported_versions) == ["v1.DRAPlugin"]
            await stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=False, error="x" * 2000)
            )
            assert servicer.registered is False and len(servicer.error) == 500
    finally:
        await server.stop(None)


def test_prepare_answers_own_devices_with_the_spec_on_disk(short: Path) -> None:
    asyncio.run(_prepare_own(Driver(short, Claims())))


async def _prepare_own(driver: Driver) -> None:
    async with served(driver) as stub:
        other = {"request": "gpu", "driver": "gpu.example.com", "pool": "p", "device": "g0"}
        shared = {**_ours("hv3"), "shareID": "0a1b2c3d-0000-4000-8000-000000000001"}
        uid = driver.claims.add("c1", [_ours("hv"), other, _ours("hv2"), shared])
        answer = await stub.NodePrepareResources(
            dra.NodePrepareResourcesRequest(claims=[_claim(uid, "c1")])
        )
        one = answer.claims[uid]
        assert one.error == ""
        got = [(list(d.request_names), d.pool_name, d.device_name, d.share_id) for d in one.devices]
        assert got == [
            (["hv", "hv2"], "node-a", "kvm", ""),
            (["hv3"], "node-a", "kvm", "0a1b2c3d-0000-4000-8000-000000000001"),
        ]
        assert list(one.devices[0].cdi_device_ids) == [f"{CDI_KIND}=kvm-{uid}"]
        spec = driver.cdi / f"hyperlight-claim-{uid}.json"
        assert spec.read_bytes() == desired_spec(
            device_name="kvm", device_path="/dev/kvm", cdi_name=f"kvm-{uid}"
        )
        state = json.loads(driver.state.read_text())
        assert [c["uid"] for c in state["claims"]] == [uid]


def test_refusals_write_nothing(short: Path) -> None:
    asyncio.run(_refusals(Driver(short, Claims())))


async def _refusals(driver: Driver) -> None:
    async with served(driver) as stub:
        recreated = driver.claims.add("c2", [_ours()])
        stale_uid = str(uuid.uuid4())  # the kubelet's UID: the claim was deleted and re-created
        foreign = driver.claims.add("c3", [{**_ours(), "driver": "other.example.com"}])
        request = dra.NodePrepareResourcesRequest(
            claims=[_claim(stale_uid, "c2"), _claim(foreign, "c3"), _claim("not-a-uuid", "c3")]
        )
        answer = await stub.NodePrepareResources(request)
        assert "re-created" in answer.claims[stale_uid].error
        assert "nothing allocated by" in answer.claims[foreign].error
        assert "re-created" in answer.claims["not-a-uuid"].error
        driver.reasons = ["device /dev/kvm: not a hypervisor"]
        answer = await stub.NodePrepareResources(
            dra.NodePrepareResourcesRequest(claims=[_claim(recreated, "c2")])
        )
        assert (
            answer.claims[recreated].error == "device not usable: device /dev/kvm: not a hypervisor"
        )
        assert list(driver.cdi.iterdir()) == [] and not driver.state.exists()


def test_a_prepared_claim_survives_a_driver_restart_and_unprepare_leaves_nothing(
    tmp_path: Path,
) -> None:
    asyncio.run(_restart(tmp_path))


async def _restart(tmp_path: Path) -> None:
    claims = Claims()
    driver = Driver(tmp_path, claims)
    uid = claims.add("c4", [_ours()])
    request = dra.NodePrepareResourcesRequest(claims=[_claim(uid, "c4")])
    first = await driver.servicer().NodePrepareResources(request, None)  # type: ignore[arg-type]
    reads = claims.reads
    driver.reasons = ["would refuse a new claim"]  # a prepared claim is not verified again
    (driver.cdi / f"hyperlight-claim-{uid}.json").unlink()  # and its spec is made exact again
    again = await driver.servicer().NodePrepareResources(request, None)  # type: ignore[arg-type]
    assert again == first and claims.reads == reads
    assert (driver.cdi / f"hyperlight-claim-{uid}.json").exists()
    restarted = driver.servicer()
    done = await restarted.NodeUnprepareResources(
        dra.NodeUnprepareResourcesRequest(
            claims=[_claim(uid, "c4"), _claim(str(uuid.uuid4()), "x")]
        ),
        None,  # type: ignore[arg-type]
    )
    assert all(c.error == "" for c in done.claims.values())
    assert list(driver.cdi.iterdir()) == []
    assert json.loads(driver.state.read_text())["claims"] == []


def test_a_stray_claim_spec_is_swept_at_start(tmp_path: Path) -> None:
    driver = Driver(tmp_path, Claims())
    stray = str(uuid.uuid4())
    driver.specs.write(stray)  # written, then the driver crashed before recording the claim
    (driver.cdi / "someone-else.json").write_text("{}")
    assert driver.servicer().sweep() == [stray]
    assert [p.name for p in driver.cdi.iterdir()] == ["someone-else.json"]


def test_the_state_file_is_never_written_through_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    (tmp_path / "state.json").symlink_to(target)
    store = ClaimStore(tmp_path / "state.json")
    with pytest.raises(ClaimStateError, match=r"state\.json"):
        store.load()
    store.put(PreparedClaim(str(uuid.uuid4()), "ns", "c", ()))  # replaces the link, not its target
    assert target.read_text() == "untouched"
    assert not (tmp_path / "state.json").is_symlink()
