"""Start-up refusal, device-access mode, bounded registration, exec probes."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hv_device_plugin.registration import KUBELET_LISTENING
from tests.plugin.kubelet_stub import KubeletStub
from tests.plugin.plugin_process import Node, PluginProcess, Stream, wait_for

PLUGIN = [sys.executable, "-m", "hv_device_plugin"]


@pytest.mark.parametrize(
    "device",
    ["/dev/null", "/etc/passwd", "dev/kvm", "/dev/kvm/../null", "/dev//kvm", "", "SYMLINK"],
)
def test_invalid_hypervisor_device_refused_before_writing(tmp_path: Path, device: str) -> None:
    if device == "SYMLINK":
        device = str(tmp_path / "kvm-link")
        os.symlink("/dev/kvm", device)
    cdi, plugins = tmp_path / "cdi", tmp_path / "plugins"
    cdi.mkdir()
    plugins.mkdir()
    proc = subprocess.run(
        [
            *PLUGIN,
            "--hypervisor-device",
            device,
            "--cdi-dir",
            str(cdi),
            "--device-plugin-dir",
            str(plugins),
            "--health-addr",
            "",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused" in lines[0], proc.stderr
    assert not list(cdi.iterdir()) and not list(plugins.iterdir()), "nothing may be written"


def test_env_variable_sets_option(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*PLUGIN, "--health-addr", ""],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "HV_HYPERVISOR_DEVICE": "/dev/null"},
    )
    assert proc.returncode == 2 and "/dev/null" in proc.stderr


def test_help_names_every_env_variable() -> None:
    out = subprocess.run([*PLUGIN, "--help"], capture_output=True, text=True, timeout=30).stdout
    for env in (
        "HV_HYPERVISOR_DEVICE",
        "HV_CDI_DIR",
        "HV_HOST_DEV_DIR",
        "HV_PROBE_TIMEOUT",
        "HV_MODE",
        "HV_REGISTER_ATTEMPTS",
    ):
        assert env in out


def test_device_access_mode_gives_a_device_spec(node: Node, kubelet: KubeletStub) -> None:
    proc = PluginProcess(node, kubelet, "--mode", "device-access")
    try:
        (reg,) = kubelet.wait_registrations(1, 20)
        assert reg.resource_name == "hyperlight.dev/device-access"
        assert reg.endpoint.startswith("hyperlight-access-")
        stream = Stream(proc.socket())
        wait_for(lambda: stream.healthy_count() == 1, 10, "one healthy device-access device")
        assert stream.snapshots[-1] == [("kvm-access", "Healthy")]
        (c,) = proc.allocate("kvm-access").container_responses
        assert [(d.container_path, d.host_path, d.permissions) for d in c.devices] == [
            ("/dev/kvm", "/dev/kvm", "rw")
        ]
        assert not c.cdi_devices
        assert not list(node.cdi_dir.iterdir()), "device-access mode writes no CDI spec"
        stream.cancel()
    finally:
        assert proc.stop() == 0


def _gave_up(proc: PluginProcess, what: str) -> None:
    """Wait (30 s) for the plugin's register_gave_up event."""
    wait_for(lambda: any(e.get("event") == "register_gave_up" for e in proc.events()), 30, what)


def test_registration_bounded_then_recovers(node: Node) -> None:
    kubelet = KubeletStub(node.plugin_dir)  # not started: nobody listens on kubelet.sock
    proc = PluginProcess(node, kubelet, "--register-attempts", "3", "--register-backoff-max", "0.2")
    try:
        _gave_up(proc, "plugin to give up after 3 attempts")
        failures = [e for e in proc.events() if e.get("event") == "register_failed"]
        assert len(failures) == 3
        status, body = proc.http("/readyz")
        assert status == 503 and "gave up" in body["conditions"]["registered"]["reason"]
        assert proc.http("/healthz")[0] == 200
        kubelet.start()
        (reg,) = kubelet.wait_registrations(1, 20)
        assert reg.serving
        stream = Stream(proc.socket())
        wait_for(proc.ready, 10, "readiness after the kubelet appeared")
        stream.cancel()
    finally:
        assert proc.stop() == 0
        kubelet.stop()


def test_a_kubelet_back_after_the_attempts_gave_up_gets_a_registration(node: Node) -> None:
    """A CI run's restart-kubelet (crash) on a loaded machine: the kubelet's SIGKILL ended the
    plugin's stream while its socket still accepted (the process was exiting), so the plugin
    took it for a lost stream and re-registered at once; every attempt failed while the kubelet
    was down, and they ran out before it came back. The kubelet's start-up cleanup then removed
    every socket and made kubelet.sock again, which ext4 gives the number of the inode just
    freed: the plugin served again but never registered (60 s, no registration request).

    Here: a stale kubelet.sock nobody listens on (a killed kubelet's), the attempts give up, then
    a kubelet starts as the real one does (every socket removed, kubelet.sock bound)."""
    stale = node.plugin_dir / "kubelet.sock"
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(stale))  # closed without unlink: the file a SIGKILLed kubelet leaves
    old = stale.lstat().st_ino
    kubelet = KubeletStub(node.plugin_dir)
    proc = PluginProcess(node, kubelet, "--register-attempts", "2", "--register-backoff-max", "0.1")
    try:
        _gave_up(proc, "plugin to give up after 2 attempts on the stale kubelet.sock")
        # The kubelet's start-up: its cleanup and its Listen take microseconds, a plugin notices
        # both after they happened; the freed inode goes to the new kubelet.sock, as it does
        # for the real kubelet (the plugin's own socket is removed last here, so that its new
        # one cannot take the inode first).
        stale.unlink()
        kubelet.start()
        back = kubelet.started_at
        reused = stale.lstat().st_ino == old
        for ours in node.plugin_dir.glob("hyperlight*.sock"):
            ours.unlink()
        reg = kubelet.wait_serving_after(back, 20)  # TimeoutError names the attempts seen
        assert reg.resource_name == "hyperlight.dev/hypervisor", (reg, f"{reused=}")
        stream = Stream(proc.socket())  # the kubelet's ListAndWatch, as after any Register
        wait_for(proc.ready, 10, "readiness after the kubelet came back")
        stream.cancel()
    finally:
        assert proc.stop() == 0
        kubelet.stop()


def _relay(listener: socket.socket, to: Path) -> None:
    """Accept on `listener` and pass each connection's bytes to and from the socket at `to`."""

    def pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # the listener closed: the test is over
        upstream = socket.socket(socket.AF_UNIX)
        upstream.connect(str(to))
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()


def test_a_kubelet_socket_that_starts_accepting_after_the_attempts_gave_up(node: Node) -> None:
    """A CI run's graceful kubelet restart: the kubelet's start-up events (its cleanup deleting
    every socket, its new socket's bind before its listen) kicked the plugin's 8 attempts out in
    24 ms, the last one against the socket just bound, not yet listening; the plugin gave up
    with that socket as the kubelet's, and nothing changed after: never registered again.

    Here the kubelet's socket is bound and not listening (connect refused) until the attempts
    gave up; then the very same socket listens (a relay hands its connections to a kubelet
    stub), which no inotify event announces: the plugin must still register."""
    path = node.plugin_dir / "kubelet.sock"
    bound = socket.socket(socket.AF_UNIX)
    bound.bind(str(path))  # bound, not listening: a connect is refused
    kubelet = KubeletStub(node.plugin_dir)
    behind = node.root / "stub.sock"
    proc = PluginProcess(node, kubelet, "--register-attempts", "2", "--register-backoff-max", "0.1")
    try:
        _gave_up(proc, "plugin to give up on a kubelet socket that does not listen yet")
        kubelet.start(at=behind)
        bound.listen(16)
        threading.Thread(target=_relay, args=(bound, behind), daemon=True).start()
        reg = kubelet.wait_serving_after(0.0, 30)  # TimeoutError names the attempts seen
        assert reg.resource_name == "hyperlight.dev/hypervisor"
        assert any(
            e.get("event") == "restart_detected" and e.get("reason") == KUBELET_LISTENING
            for e in proc.events()
        ), "the plugin did not say why it registered again"
    finally:
        assert proc.stop() == 0
        kubelet.stop()
        bound.close()


def test_exec_probe_subcommand(plugin: PluginProcess, node: Node) -> None:
    def probe(which: str) -> tuple[int, dict[str, str]]:
        r = subprocess.run(
            [*PLUGIN, "probe", which, "--device-plugin-dir", str(node.plugin_dir)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return r.returncode, json.loads(r.stdout)

    assert probe("liveness")[0] == 0
    code, answer = probe("readiness")
    assert code == 1 and answer["status"] == "NOT_SERVING"  # no ListAndWatch stream yet
    stream = Stream(plugin.socket())
    wait_for(lambda: probe("readiness")[0] == 0, 10, "readiness probe to pass")
    stream.cancel()
