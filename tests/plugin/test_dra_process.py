"""`hv-device-plugin --mode dra` as a real process: its configuration refusals, its sockets in
the order the kubelet's plugin watcher needs them, its answers over real gRPC, its stop.

The harness plays the kubelet's plugin watcher (GetInfo on the registration socket, then
NotifyRegistrationStatus) and the kubelet's DRA manager (NodePrepareResources). The API server
is absent here on purpose: the driver must keep serving, refuse to prepare a claim it cannot
read (a per-claim error the kubelet retries) and retry its slice; the live DRA checks judge it
against a real API server and kubelet.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hv_device_plugin.api import dra_pb2 as dra
from hv_device_plugin.api import dra_pb2_grpc as dra_grpc
from hv_device_plugin.api import drahealth_pb2 as hp
from hv_device_plugin.api import drahealth_pb2_grpc as hp_grpc
from hv_device_plugin.api import pluginregistration_pb2 as reg
from hv_device_plugin.api import pluginregistration_pb2_grpc as reg_grpc
from hv_device_plugin.api.names import DRA_DRIVER
from tests.plugin.plugin_process import wait_for

KVM = Path("/dev/kvm")


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hvdra-", dir="/tmp"))  # short: socket paths
    for sub in ("registry", "driver", "cdi"):
        (path / sub).mkdir()
    # a real CA (its server never answers: nothing listens on the port)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(path / "ca.key"),
                    "-out", str(path / "ca.crt"), "-days", "1", "-subj", "/CN=hv-test-ca"],
                   check=True, capture_output=True)  # fmt: skip
    (path / "not-a-ca.crt").write_text("not a certificate\n")
    (path / "token").write_text("t\n")
    yield path
    shutil.rmtree(path)


def _argv(root: Path, *extra: str) -> list[str]:
    with socket.socket() as s:  # a port nothing listens on: the API server is absent
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "hv_device_plugin", "--mode", "dra", "--node-name", "node-a",
            "--plugins-registry-dir", str(root / "registry"), "--dra-plugin-dir",
            str(root / "driver"), "--cdi-dir", str(root / "cdi"), "--health-addr", "",
            "--kube-api-server", f"https://127.0.0.1:{port}", "--kube-ca-file",
            str(root / "ca.crt"), "--kube-token-file", str(root / "token"), *extra]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (("--node-name", "Node_A"), "--node-name: 'Node_A' is not a DNS subdomain"),
        (("--driver-name", "x" * 64), "--driver-name:"),
        (("--kube-ca-file", ""), "--kube-ca-file: required with --kube-api-server"),
        (("--kube-api-server", "http://x"), "must be an https:// URL"),
        (("--plugins-registry-dir", "/nonexistent-hv"), "--plugins-registry-dir:"),
        (("--kube-ca-file", "{root}/not-a-ca.crt"), "--kube-ca-file: not a CA bundle"),
        (("--kube-client-key", "{root}/ca.key"), "--kube-client-key: needs --kube-client-cert"),
    ],
)
def test_refusals_are_one_line_and_create_nothing(
    root: Path, change: tuple[str, str], words: str
) -> None:
    argv = _argv(root)
    flag, value = change[0], change[1].format(root=root)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr, done.stderr
    for made in ("registry", "driver", "cdi"):  # nothing written
        assert list((root / made).iterdir()) == [], made


def _probe(root: Path, which: str) -> int:
    argv = [sys.executable, "-m", "hv_device_plugin", "probe", which, "--mode", "dra", "--dra-plugin-dir",
            str(root / "driver")]  # fmt: skip
    return subprocess.run(argv, capture_output=True, timeout=30).returncode


@pytest.mark.kvm
def test_sockets_answers_and_stop(root: Path) -> None:
    assert KVM.exists(), "needs /dev/kvm"
    proc = subprocess.Popen(_argv(root), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    reg_sock = root / "registry" / f"{DRA_DRIVER}-reg.sock"
    endpoint = root / "driver" / "dra.sock"
    try:
        wait_for(reg_sock.exists, 30, "the registration socket")
        assert endpoint.exists(), "the registration socket appeared before the endpoint"
        assert _probe(root, "liveness") == 0
        assert _probe(root, "readiness") == 1, "ready before the kubelet took the registration"
        with grpc.insecure_channel(f"unix:{reg_sock}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = stub.GetInfo(reg.InfoRequest(), timeout=10)
            assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRA_DRIVER, str(endpoint))
            assert list(info.supported_versions) == ["v1.DRAPlugin", "v1.DRAResourceHealth"]
            stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=True), timeout=10
            )
        uid = str(uuid.uuid4())
        with grpc.insecure_channel(f"unix:{info.endpoint}") as channel:
            answer = dra_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra.NodePrepareResourcesRequest(
                    claims=[dra.Claim(namespace="ns", uid=uid, name="c")]
                ),
                timeout=30,
            )
        assert answer.claims[uid].error and not answer.claims[uid].devices
        with grpc.insecure_channel(f"unix:{info.endpoint}") as channel:
            stream = hp_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                hp.NodeWatchResourcesRequest(), timeout=30
            )
            first = next(iter(stream)).devices[0]
            stream.cancel()
        assert (first.device.pool_name, first.device.device_name) == ("node-a", "kvm")
        assert first.health == hp.HEALTHY and first.health_check_timeout_seconds >= 30
        assert list((root / "cdi").iterdir()) == []
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    events = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    names = [e.get("event") or e.get("msg") for e in events]
    assert proc.returncode == 0, out.decode()[-2000:]
    assert "slice_publish_failed" in names, names  # the registration made it try, and retry
    assert not reg_sock.exists() and not endpoint.exists()
    assert list((root / "cdi").iterdir()) == []
