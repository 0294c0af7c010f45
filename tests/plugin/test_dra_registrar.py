"""The DRA driver's registration socket heals itself (hv_device_plugin.dra.registrar).

The kubelet's plugin watcher deregisters a driver when its registration socket is deleted and
registers it again when a socket appears at the path (v1.37.2 pkg/kubelet/pluginmanager/
pluginwatcher). Judged with the daemon's own pieces over real gRPC on real unix sockets:
RegistrationServicer served by the Registrar, the daemon's _follow turning the kubelet's word
into readiness and slice publications, and the SlicePublisher writing through the real API
client to a real HTTPS server. The harness plays the plugin watcher: it dials the socket it
finds at the path (GetInfo) and answers NotifyRegistrationStatus, as the kubelet does.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from hv_device_plugin.api import pluginregistration_pb2 as reg
from hv_device_plugin.api import pluginregistration_pb2_grpc as reg_grpc
from hv_device_plugin.dra.daemon import SlicePublisher, _follow
from hv_device_plugin.dra.registrar import LOST, Registrar
from hv_device_plugin.dra.service import RegistrationServicer
from hv_device_plugin.dra.slice import SliceFacts
from hv_device_plugin.health import HealthState
from tests.plugin.kube_api_stub import ApiStub
from tests.plugin.log_events import Events, plugin_events

DRIVER = "hypervisor.hyperlight.dev"
CHECK_S = 0.05


@pytest.fixture
def root() -> Iterator[Path]:
    """A short root: unix socket paths must fit in 107 bytes (tmp_path's do not always)."""
    path = Path(tempfile.mkdtemp(prefix="hvr-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


@dataclass
class Driver:
    sock: Path
    servicer: RegistrationServicer
    registrar: Registrar
    health: HealthState
    stub: ApiStub
    events: Events

    def identity(self) -> tuple[int, int, int] | None:
        """The socket at the path (inode numbers are reused: its change time too), or None."""
        try:
            st = os.lstat(self.sock)
        except FileNotFoundError:
            return None
        return (st.st_dev, st.st_ino, st.st_ctime_ns) if stat.S_ISSOCK(st.st_mode) else None

    def recreated(self) -> int:
        return len(self.events.named("registration_socket_recreated"))


@asynccontextmanager
async def running(root: Path) -> AsyncIterator[Driver]:
    """The registration side of run_dra: registrar, _follow and the slice publisher."""
    sock = root / f"{DRIVER}-reg.sock"
    servicer = RegistrationServicer(DRIVER, str(root / "dra.sock"))
    health = HealthState(streams_required=False)
    health.set_device(True, "")
    health.set_cdi(True, "")
    with ApiStub(root) as stub, plugin_events() as events:
        publisher = SlicePublisher(stub.api(), SliceFacts(DRIVER, "node-a", "kvm", None, 4),
                                   health, servicer)  # fmt: skip
        registrar = Registrar(sock, servicer, check_s=CHECK_S)
        await registrar.start()
        tasks = [asyncio.ensure_future(c) for c in (registrar.run(), publisher.run(),
                                                    _follow(health, servicer, publisher))]  # fmt: skip
        try:
            yield Driver(sock, servicer, registrar, health, stub, events)
        finally:
            registrar.unlink()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await registrar.stop()


async def kubelet_registers(driver: Driver) -> None:
    """The plugin watcher's part: GetInfo on the socket at the path, then its verdict."""
    async with grpc.aio.insecure_channel(f"unix:{driver.sock}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(reg.InfoRequest(), timeout=10)
        assert (info.type, info.name, info.endpoint) == (
            "DRAPlugin",
            DRIVER,
            str(driver.sock.parent / "dra.sock"),
        )
        await stub.NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=True), timeout=10
        )


async def until(pred: Callable[[], object], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while not pred():
        assert loop.time() < deadline, f"wait expired: {what}"
        await asyncio.sleep(0.01)  # polling a condition, with a deadline


async def registered_and_published(driver: Driver, writes: int) -> None:
    await kubelet_registers(driver)
    await until(lambda: driver.health.ready, "ready once the kubelet took the registration")
    await until(lambda: driver.stub.slice_writes >= writes, f"slice write {writes}")


def test_a_removed_socket_is_served_again_and_the_slice_republished(root: Path) -> None:
    asyncio.run(_removed(root))


async def _removed(root: Path) -> None:
    async with running(root) as driver:
        await registered_and_published(driver, 1)
        first = driver.identity()
        driver.sock.unlink()  # what the plugin watcher deregisters the driver on
        await until(lambda: driver.servicer.registered is False, "unregistered")
        await until(lambda: not driver.health.ready, "readiness drops")
        assert driver.health.registered.reason == LOST
        await until(lambda: driver.recreated() == 1, "a new socket at the path")
        assert driver.identity() not in (None, first)
        assert not driver.health.ready, "ready again before the kubelet spoke"
        assert driver.stub.slice_writes == 1, "published while not registered"
        await registered_and_published(driver, 2)  # the new registration republishes
        assert driver.servicer.registered is True
        lost = driver.events.named("registration_socket_lost")
        assert [e["found"] for e in lost] == ["nothing"]


def test_a_stale_socket_in_its_place_is_replaced(root: Path) -> None:
    asyncio.run(_stale(root))


async def _stale(root: Path) -> None:
    async with running(root) as driver:
        await registered_and_published(driver, 1)
        driver.sock.unlink()
        with socket.socket(socket.AF_UNIX) as stale:  # bound, never listening: a dead socket
            stale.bind(str(driver.sock))
            planted = driver.identity()
            await until(lambda: driver.recreated() == 1, "replaced")
            assert driver.identity() not in (None, planted)
        await registered_and_published(driver, 2)
        replaced = driver.events.named("registration_socket_recreated")
        assert [e["replaced"] for e in replaced] == ["another socket"]  # no await in between


def test_something_else_in_its_place_is_left_alone_until_it_goes(root: Path) -> None:
    asyncio.run(_obstructed(root))


async def _obstructed(root: Path) -> None:
    async with running(root) as driver:
        await registered_and_published(driver, 1)
        driver.sock.unlink()
        driver.sock.mkdir()  # not this driver's: never removed
        (driver.sock / "keep").write_text("x")
        await until(lambda: not driver.health.ready, "readiness drops")
        checks = driver.registrar.checks
        await until(lambda: driver.registrar.checks >= checks + 5, "five more checks")
        assert (driver.sock / "keep").read_text() == "x"
        assert len(driver.events.named("registration_socket_obstructed")) == 1, "logged once"
        assert driver.recreated() == 0
        shutil.rmtree(driver.sock)
        await until(lambda: driver.recreated() == 1, "served once the path is free")
        assert driver.identity() is not None
        await registered_and_published(driver, 2)


def test_shutdown_removes_only_its_own_socket(root: Path) -> None:
    asyncio.run(_shutdown(root))


async def _shutdown(root: Path) -> None:
    sock = root / f"{DRIVER}-reg.sock"
    async with running(root) as driver:
        await registered_and_published(driver, 1)
    assert not sock.exists(), "its own socket is left behind"
    async with running(root) as driver:
        driver.sock.unlink()
        driver.sock.write_text("someone else's")  # replaced by a file just before the stop
    assert sock.read_text() == "someone else's"
    sock.unlink()
    sock.mkdir()
    with pytest.raises(RuntimeError, match="not a socket"):  # at start: refused, as before
        await Registrar(sock, RegistrationServicer(DRIVER, "x")).start()
