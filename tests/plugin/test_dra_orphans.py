"""Prepared claims whose ResourceClaim is gone are unprepared by the driver itself.

The defect this guards against: a claim recorded as prepared (its CDI spec written) that the
kubelet never unprepares (a failed NodePrepareResources, the pod deleted, a retry or a race
recording the claim anyway) kept its spec for ever. Judged with the driver's real parts: the
DraServicer preparing claims through the real API client (hv_device_plugin.dra.kubeapi over HTTPS) from
a real HTTPS server, the real state file and the real claim specs in a temporary dir. A claim
the API server no longer has, or has under another UID, is unprepared; a live claim is kept;
an API that does not answer clearly (an error status, no connection, an object without a UID)
keeps every claim until a later pass gets an answer.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hv_device_plugin.api import dra_pb2 as dra
from hv_device_plugin.api.names import CDI_KIND
from hv_device_plugin.dra.claim_specs import ClaimSpecs
from hv_device_plugin.dra.claims import ClaimStore, PreparedClaim
from hv_device_plugin.dra.daemon import ClaimReader
from hv_device_plugin.dra.kubeapi import ApiAccess, KubeApi
from hv_device_plugin.dra.orphans import OrphanReaper
from hv_device_plugin.dra.service import DraServicer
from tests.plugin.kube_api_stub import ApiStub
from tests.plugin.log_events import Events, plugin_events

DRIVER = "hypervisor.hyperlight.dev"
OURS = {"request": "hv", "driver": DRIVER, "pool": "node-a", "device": "kvm"}


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[ApiStub]:
    with ApiStub(tmp_path) as api:
        yield api


@pytest.fixture
def events() -> Iterator[Events]:
    with plugin_events() as seen:
        yield seen


class Node:
    """The driver's state on one node: its claim state file and the claims' CDI specs."""

    def __init__(self, root: Path, stub: ApiStub) -> None:
        self.cdi, self.state = root / "cdi", root / "claims.json"
        self.cdi.mkdir()
        self.specs = ClaimSpecs(self.cdi, CDI_KIND, "kvm", "/dev/kvm", 65534, 65534, "0.5.0")
        self.store = ClaimStore(self.state)
        self.store.load()
        self.api = stub.api()

        async def usable() -> list[str]:
            return []

        self.servicer = DraServicer(DRIVER, self.store, self.specs, ClaimReader(self.api), usable)

    async def prepare(self, uid: str, name: str) -> None:
        request = dra.NodePrepareResourcesRequest(
            claims=[dra.Claim(namespace="ns", uid=uid, name=name)]
        )
        answer = await self.servicer.NodePrepareResources(request, None)  # type: ignore[arg-type]
        assert answer.claims[uid].error == "" and answer.claims[uid].devices

    def spec_of(self, uid: str) -> Path:
        return self.cdi / self.specs.filename(uid)

    def prepared_on_disk(self) -> list[str]:
        return [c["uid"] for c in json.loads(self.state.read_text())["claims"]]

    def unprepared(self, uid: str) -> bool:
        """Both gone: the spec (removed first) and the claim in the state file."""
        return not self.spec_of(uid).exists() and uid not in self.prepared_on_disk()


def test_gone_and_recreated_claims_are_unprepared_a_live_one_kept(
    tmp_path: Path, stub: ApiStub, events: Events
) -> None:
    asyncio.run(_gone_and_recreated(Node(tmp_path, stub), stub, events))


async def _gone_and_recreated(node: Node, stub: ApiStub, events: Events) -> None:
    live = stub.add_claim("live", [OURS])
    gone = stub.add_claim("gone", [OURS])
    old = stub.add_claim("again", [OURS])
    for uid, name in ((live, "live"), (gone, "gone"), (old, "again")):
        await node.prepare(uid, name)
    stub.delete_claim("gone")  # its pod went; the kubelet never unprepared it
    new = stub.add_claim("again", [OURS])  # deleted and re-created under the same name
    reaper = OrphanReaper(node.servicer, node.api)
    assert await reaper.reap() is False
    assert node.prepared_on_disk() == [live]
    assert node.spec_of(live).is_file()
    assert not node.spec_of(gone).exists() and not node.spec_of(old).exists()
    assert sorted(p.name for p in node.cdi.iterdir()) == [node.specs.filename(live)]
    logged = {e["uid"]: e for e in events.named("dra_orphan_unprepared")}
    assert logged.keys() == {gone, old}
    assert logged[gone]["claim"] == "ns/gone" and "no longer exists" in logged[gone]["reason"]
    assert (logged[old]["namespace"], logged[old]["name"]) == ("ns", "again")
    assert new[:40] in logged[old]["reason"] and "re-created" in logged[old]["reason"]
    assert await reaper.reap() is False  # a second pass finds nothing more
    assert len(events.named("dra_orphan_unprepared")) == 2
    assert node.prepared_on_disk() == [live]


@pytest.mark.parametrize(
    "failure", ["status 500", "status 403", "no uid in the answer", "no API server"]
)
def test_an_unclear_answer_keeps_every_claim_until_a_clear_one(
    tmp_path: Path, stub: ApiStub, events: Events, failure: str
) -> None:
    asyncio.run(_unclear(Node(tmp_path, stub), stub, events, failure))


async def _unclear(node: Node, stub: ApiStub, events: Events, failure: str) -> None:
    uids = [stub.add_claim(name, [OURS]) for name in ("c1", "c2")]
    for uid, name in zip(uids, ("c1", "c2"), strict=True):
        await node.prepare(uid, name)
        stub.delete_claim(name)  # gone: a clear answer would unprepare both
    api: KubeApi = node.api
    if failure.startswith("status "):
        stub.claim_status = int(failure.split()[1])
    elif failure == "no uid in the answer":
        stub.claim_body = {"metadata": {"name": "c1", "namespace": "ns"}}
    else:  # the same client against a port nothing listens on
        api = KubeApi(ApiAccess(stub.url.rsplit(":", 1)[0] + ":1", str(stub.ca_file)))
    reaper = OrphanReaper(node.servicer, api)
    assert await reaper.reap() is True, "a pass without an answer must say so (sooner retry)"
    assert sorted(node.prepared_on_disk()) == sorted(uids)
    assert all(node.spec_of(uid).is_file() for uid in uids)
    assert events.named("dra_orphan_unprepared") == []
    warned = events.named("dra_orphan_check_failed")
    assert len(warned) == 1, "one warning per pass, not one per claim"
    assert warned[0]["claims_unchecked"] == 2 and warned[0]["retry"] == "next pass"
    # the next pass, with an answer, unprepares them
    stub.claim_status, stub.claim_body = 0, None
    assert await OrphanReaper(node.servicer, node.api).reap() is False
    assert node.prepared_on_disk() == [] and list(node.cdi.iterdir()) == []


def test_a_claim_unprepared_by_the_kubelet_meanwhile_is_left_to_it(
    tmp_path: Path, stub: ApiStub, events: Events
) -> None:
    asyncio.run(_kubelet_first(Node(tmp_path, stub), stub, events))


async def _kubelet_first(node: Node, stub: ApiStub, events: Events) -> None:
    uid = stub.add_claim("c", [OURS])
    await node.prepare(uid, "c")
    claim = node.store.get(uid)
    assert claim is not None
    request = dra.NodeUnprepareResourcesRequest(
        claims=[dra.Claim(namespace="ns", uid=uid, name="c")]
    )
    await node.servicer.NodeUnprepareResources(request, None)  # type: ignore[arg-type]
    assert await node.servicer.unprepare_orphan(claim) is False
    assert events.named("dra_unprepared") and not events.named("dra_orphan_unprepared")


def test_the_reaper_passes_at_start_and_then_periodically(
    tmp_path: Path, stub: ApiStub, events: Events
) -> None:
    asyncio.run(_periodic(Node(tmp_path, stub), stub))


async def _periodic(node: Node, stub: ApiStub) -> None:
    kept, later = stub.add_claim("kept", [OURS]), stub.add_claim("later", [OURS])
    await node.prepare(kept, "kept")
    await node.prepare(later, "later")
    gone = str(uuid.uuid4())
    devices = node.store.all()[0].devices
    node.store.put(PreparedClaim(gone, "ns", "never-existed", devices))  # by a racing retry
    node.specs.write(gone)
    reaper = OrphanReaper(node.servicer, node.api, interval_s=0.05)
    task = asyncio.ensure_future(reaper.run())
    try:
        await _until(lambda: node.unprepared(gone), "the first pass, at start")
        assert sorted(node.prepared_on_disk()) == sorted([kept, later])
        stub.delete_claim("later")
        await _until(lambda: node.unprepared(later), "a later pass")
        assert node.prepared_on_disk() == [kept] and node.spec_of(kept).is_file()
        passes = reaper.passes
        await _until(lambda: reaper.passes >= passes + 3, "passes go on")
        assert node.prepared_on_disk() == [kept]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _until(pred: Any, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while not pred():
        assert loop.time() < deadline, f"wait expired: {what}"
        await asyncio.sleep(0.01)  # polling a condition, with a deadline
