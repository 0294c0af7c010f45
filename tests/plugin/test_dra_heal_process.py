"""`hv-device-plugin --mode dra` as a real process heals what the kubelet will not.

Against a real HTTPS API server (tests/plugin/kube_api_stub.py) and with the harness playing
the kubelet over real gRPC on real unix sockets:
- its registration socket deleted while it runs, the driver drops its readiness, serves a new
  socket at the same path, answers GetInfo there and is ready again once told it is registered,
  and its slice is published again on that registration;
- a claim it prepared whose ResourceClaim was deleted while it was down (the kubelet never
  unprepared it) is unprepared by its first pass at start: the CDI spec and the state go.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hv_device_plugin.api import dra_pb2 as dra
from hv_device_plugin.api import dra_pb2_grpc as dra_grpc
from hv_device_plugin.api import pluginregistration_pb2 as reg
from hv_device_plugin.api import pluginregistration_pb2_grpc as reg_grpc
from hv_device_plugin.api.names import DRA_DRIVER
from hv_device_plugin.endpoints import READINESS_SERVICE
from tests.plugin.kube_api_stub import ApiStub
from tests.plugin.plugin_process import wait_for

pytestmark = pytest.mark.kvm
OURS = {"request": "hv", "driver": DRA_DRIVER, "pool": "node-a", "device": "kvm"}


@pytest.fixture
def root() -> Iterator[Path]:
    if not Path("/dev/kvm").exists():
        pytest.skip("needs /dev/kvm")
    path = Path(tempfile.mkdtemp(prefix="hvh-", dir="/tmp"))  # short: socket paths
    for sub in ("registry", "driver", "cdi"):
        (path / sub).mkdir()
    (path / "token").write_text("t\n")
    yield path
    shutil.rmtree(path)


@pytest.fixture
def stub(root: Path) -> Iterator[ApiStub]:
    with ApiStub(root) as api:
        yield api


class Driver:
    def __init__(self, root: Path, log: Path) -> None:
        self.reg_sock = root / "registry" / f"{DRA_DRIVER}-reg.sock"
        self.endpoint = root / "driver" / "dra.sock"
        self.log = log

    def events(self, name: str) -> list[dict[str, Any]]:
        """The driver's log events so far (whole lines only: it may be writing one now)."""
        lines = self.log.read_text().split("\n")[:-1]
        return [e for e in map(json.loads, filter(None, lines)) if e.get("event") == name]

    def reg_identity(self) -> tuple[int, int, int] | None:
        try:
            st = os.lstat(self.reg_sock)
        except FileNotFoundError:
            return None
        return (st.st_dev, st.st_ino, st.st_ctime_ns) if stat.S_ISSOCK(st.st_mode) else None

    def register(self) -> None:
        """The plugin watcher's part on the socket at the path."""
        with grpc.insecure_channel(f"unix:{self.reg_sock}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = stub.GetInfo(reg.InfoRequest(), timeout=10)
            assert (info.type, info.name, info.endpoint) == (
                "DRAPlugin",
                DRA_DRIVER,
                str(self.endpoint),
            )
            stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=True), timeout=10
            )

    def ready(self) -> bool:
        """What the readiness probe asks: gRPC Health on the endpoint."""
        with grpc.insecure_channel(f"unix:{self.endpoint}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=READINESS_SERVICE), timeout=10
            )
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def prepare(self, uid: str, name: str) -> dra.NodePrepareResourcesResponse:
        request = dra.NodePrepareResourcesRequest(
            claims=[dra.Claim(namespace="ns", uid=uid, name=name)]
        )
        with grpc.insecure_channel(f"unix:{self.endpoint}") as channel:
            answer: dra.NodePrepareResourcesResponse = dra_grpc.DRAPluginStub(
                channel
            ).NodePrepareResources(request, timeout=30)
        return answer


@contextmanager
def driver_process(root: Path, stub: ApiStub, run: str) -> Iterator[Driver]:
    log = root / f"driver-{run}.log"
    argv = [sys.executable, "-m", "hv_device_plugin", "--mode", "dra", "--node-name", "node-a",
            "--plugins-registry-dir", str(root / "registry"), "--dra-plugin-dir",
            str(root / "driver"), "--cdi-dir", str(root / "cdi"), "--health-addr", "",
            "--kube-api-server", stub.url, "--kube-ca-file", str(stub.ca_file),
            "--kube-token-file", str(root / "token")]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    driver = Driver(root, log)
    try:

        def serving() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            return driver.reg_sock.exists()

        wait_for(serving, 30, "the registration socket")
        yield driver
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0, log.read_text()[-3000:]
    assert not driver.reg_sock.exists() and not driver.endpoint.exists()


def test_a_deleted_registration_socket_comes_back_and_readiness_with_it(
    root: Path, stub: ApiStub
) -> None:
    with driver_process(root, stub, "a") as driver:
        driver.register()
        wait_for(driver.ready, 20, "ready once registered", interval=0.05)
        wait_for(lambda: stub.slice_writes >= 1, 20, "the slice published")
        first = driver.reg_identity()
        driver.reg_sock.unlink()
        wait_for(lambda: not driver.ready(), 10, "readiness drops", interval=0.05)
        wait_for(lambda: driver.reg_identity() not in (None, first), 10, "a new socket")
        assert not driver.ready(), "ready again before the kubelet took the new registration"
        writes = stub.slice_writes
        driver.register()
        wait_for(driver.ready, 20, "ready again", interval=0.05)
        wait_for(lambda: stub.slice_writes > writes, 20, "the slice published again")
        assert [e["found"] for e in driver.events("registration_socket_lost")] == ["nothing"]
        assert len(driver.events("registration_socket_recreated")) == 1


def test_a_claim_deleted_while_the_driver_was_down_is_unprepared_at_start(
    root: Path, stub: ApiStub
) -> None:
    uid = stub.add_claim("c", [OURS])
    spec = root / "cdi" / f"hyperlight-claim-{uid}.json"
    state = root / "driver" / "claims.json"
    with driver_process(root, stub, "a") as driver:
        answer = driver.prepare(uid, "c")
        assert answer.claims[uid].error == "" and spec.is_file()
        assert driver.events("dra_orphan_unprepared") == []
    assert spec.is_file(), "a prepared claim's spec outlives the driver (a restart keeps it)"
    stub.delete_claim("c")  # its pod went while the driver was down; no unprepare came
    other = str(uuid.uuid4())
    with driver_process(root, stub, "b") as driver:
        wait_for(lambda: not spec.exists(), 20, "the orphan's spec removed at start")
        wait_for(lambda: json.loads(state.read_text())["claims"] == [], 20, "its state")
        wait_for(lambda: driver.events("dra_orphan_unprepared"), 20, "the log line")
        [event] = driver.events("dra_orphan_unprepared")
        assert (event["claim"], event["uid"]) == ("ns/c", uid)
        assert "no longer exists" in event["reason"]
        assert driver.prepare(other, "c").claims[other].error, "a deleted claim is refused"
    assert list((root / "cdi").iterdir()) == []
