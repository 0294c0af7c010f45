"""The launcher, the veth network namespace and the plugin sandbox: real namespaces, no mocks."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.ledger import Ledger, read_entries, survivors
from hvconform.targets.host.launcher import LAUNCHER
from hvconform.targets.host.netns import (
    SHARED,
    IndexInUseError,
    NetNamespace,
    run_dir_shared,
    worker_index,
)
from hvconform.targets.host.procs import alive, mount_points
from hvconform.targets.host.sandbox import PluginSandbox
from tests.conformance.process_guard import children, no_leftover_processes  # noqa: F401

KVM = "/dev/kvm"
KVM_PATH = Path(KVM)
pytestmark = [
    pytest.mark.root,
    pytest.mark.kvm,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, mounts, mknod)"),
    pytest.mark.skipif(not KVM_PATH.exists(), reason="needs /dev/kvm"),
]

# A plugin stand-in: reports what it sees from inside, serves it over HTTP on every address of
# its network namespace, and exits 0 on SIGTERM like a well-behaved plugin.
PLUGIN = r"""
import fcntl, http.server, json, os, signal, sys, urllib.parse
port, token = int(sys.argv[1]), sys.argv[2]
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
def status():
    out = {}
    for line in open("/proc/self/status").read().splitlines():
        key, _, value = line.partition(":")
        out[key] = " ".join(value.split())
    return out
def node(path):
    st = os.lstat(path)
    rdev = [os.major(st.st_rdev), os.minor(st.st_rdev)]
    return {"mode": st.st_mode, "rdev": rdev, "uid": st.st_uid, "gid": st.st_gid}
def kvm():
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return {"ok": False, "error": str(exc)}
    try:
        return {"ok": True, "api": fcntl.ioctl(fd, 0xAE00)}
    finally:
        os.close(fd)
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        query = urllib.parse.parse_qs(url.query)
        routes = {"/healthz": lambda: token, "/status": status, "/kvm": kvm,
                  "/dev": lambda: {n: node("/dev/" + n) for n in os.listdir("/dev")},
                  "/stat": lambda: node(query["path"][0])}
        body = json.dumps(routes[url.path]()).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
caps = {k: v for k, v in status().items() if k.startswith("Cap") or k == "NoNewPrivs"}
print("plugin caps", json.dumps(caps), file=sys.stderr, flush=True)
http.server.HTTPServer(("0.0.0.0", port), Handler).serve_forever()
"""
BASE = {"null": (1, 3), "zero": (1, 5), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.jsonl", owner=os.environ.get("PYTEST_XDIST_WORKER", "main"))


def _leaks(ledger: Ledger) -> list[Any]:
    """Survivors; /run/netns is exempt only while someone else's namespace is inside it."""
    left = survivors(read_entries([ledger.path]))
    return [e for e in left if not (e.detail == SHARED and run_dir_shared())]


@pytest.fixture
def make_sandbox(tmp_path: Path, ledger: Ledger) -> Iterator[Callable[..., PluginSandbox]]:
    """Start sandboxes on free indices of this worker's block; close and verify each at the end."""
    made: list[PluginSandbox] = []

    def make(**kw: Any) -> PluginSandbox:
        token = secrets.token_hex(8)  # the last argv item: proves which server answered
        for slot in range(16):
            sandbox = PluginSandbox(
                [sys.executable, "-c", PLUGIN, "8080", token], run_dir=tmp_path,
                ledger=ledger, index=worker_index(slot), log_path=tmp_path / "plugin.log", **kw,
            )  # fmt: skip
            try:
                sandbox.start()
            except IndexInUseError:
                continue  # another run holds this index; try the next slot
            made.append(sandbox)
            return sandbox
        raise AssertionError("no free sandbox index in this worker's block")

    yield make
    for sandbox in made:
        sandbox.close()
    assert _leaks(ledger) == [], "resources survived the sandbox teardown"


def _get(sandbox: PluginSandbox, path: str) -> Any:
    status, body = sandbox.http_get(path, timeout=5)
    assert status == 200, body
    return json.loads(body)


def _launch(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-I", str(LAUNCHER), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


OPEN_BOTH = """
import errno, fcntl, json, os, sys
fd = os.open("/dev/kvm", os.O_RDWR)
api = fcntl.ioctl(fd, 0xAE00)
try:
    os.close(os.open(sys.argv[1], os.O_RDONLY))
    other = "opened"
except PermissionError:
    other = "EACCES"
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
print(json.dumps({"api": api, "other": other, "uid": os.getuid(),
                  "caps": {k: int(v, 16) for k, v in status.items() if k.startswith("Cap")}}))
"""


def test_zero_caps_root_opens_kvm_by_owner_bits(tmp_path: Path) -> None:
    # A 0600 file of another owner: only CAP_DAC_OVERRIDE/READ_SEARCH would let root open it.
    other = tmp_path / "other-owner"
    other.write_text("secret")
    os.chown(other, 1000, 1000)
    other.chmod(0o600)
    dropped = _launch("--drop-caps", "--no-new-privs", "--", sys.executable, "-c", OPEN_BOTH,
                      str(other))  # fmt: skip
    assert dropped.returncode == 0, dropped.stderr
    seen = json.loads(dropped.stdout)
    assert seen["uid"] == 0 and set(seen["caps"].values()) == {0}
    assert seen["api"] == 12, "uid 0 with no capabilities opens /dev/kvm (root, 0600) O_RDWR"
    assert seen["other"] == "EACCES", "capabilities really are gone: no DAC override"
    control = _launch("--", sys.executable, "-c", OPEN_BOTH, str(other))
    assert json.loads(control.stdout)["other"] == "opened", control.stderr


def test_launcher_private_dev_holds_only_listed_nodes() -> None:
    script = "import json, os; print(json.dumps({n: os.lstat('/dev/' + n).st_rdev for n in os.listdir('/dev')}))"  # noqa: E501
    res = _launch("--private-dev", "--dev-node", KVM, "--dev-node", "/dev/hv-missing-node",
                  "--", sys.executable, "-c", script)  # fmt: skip
    assert res.returncode == 0, res.stderr
    nodes = json.loads(res.stdout)
    assert nodes == {**{n: os.makedev(*mm) for n, mm in BASE.items()},
                     "kvm": KVM_PATH.stat().st_rdev}  # fmt: skip
    assert "--dev-node /dev/hv-missing-node: no such node on the host, skipped" in res.stderr


def test_launcher_failures_name_the_step(tmp_path: Path) -> None:
    missing = _launch("--", "/nonexistent/plugin")
    assert missing.returncode == 127
    assert "exec /nonexistent/plugin: No such file or directory" in missing.stderr
    outside = _launch("--private-dev", "--mknod", "/etc/hv-node:c:1:3:666:0:0", "--", "true")
    assert outside.returncode == 125 and "must be a normalised path under /dev" in outside.stderr
    script = tmp_path / "tool.sh"  # tmp_path is 0700 root: unreachable for uid 65534
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    denied = _launch("--user", "65534:65534", "--drop-caps", "--", str(script))
    assert denied.returncode == 126 and "Permission denied" in denied.stderr


def test_sandboxed_plugin_is_confined(make_sandbox: Callable[..., PluginSandbox]) -> None:
    host_kvm = KVM_PATH.stat()
    sandbox = make_sandbox()
    token = sandbox.argv[-1]
    assert sandbox.wait_http("/healthz", 20).decode() == json.dumps(token)
    # From outside, the kernel's view: nothing effective, nothing to regain, no escalation.
    assert sandbox.effective_caps() == {
        "CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapBnd": 0, "CapAmb": 0, "NoNewPrivs": 1
    }  # fmt: skip
    assert "plugin caps" in sandbox.log_tail()
    assert _get(sandbox, "/status")["Uid"].split() == ["0"] * 4
    dev = _get(sandbox, "/dev")
    assert set(dev) == {*BASE, "kvm"}
    assert {n: tuple(dev[n]["rdev"]) for n in BASE} == BASE
    assert dev["kvm"]["rdev"] == [os.major(host_kvm.st_rdev), os.minor(host_kvm.st_rdev)]
    assert _get(sandbox, "/kvm") == {"ok": True, "api": 12}
    # Own network namespace: veth peer and lo only; the root namespace's loopback is not it.
    assert sandbox.netns is not None
    assert sandbox.netns.links_inside() == {
        "lo": ["127.0.0.1"], f"hvp{sandbox.index}": [sandbox.ns_addr]
    }  # fmt: skip
    try:
        with socket.create_connection(("127.0.0.1", sandbox.http_port), timeout=2) as conn:
            conn.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            assert token.encode() not in conn.recv(65536), "plugin reachable on root loopback"
    except ConnectionRefusedError:
        pass
    assert sandbox.mnt_ns != str(Path("/proc/self/ns/mnt").readlink())
    assert sandbox.stop() == 0, sandbox.log_tail()


def test_bind_mount_is_seen_by_the_plugin_only(
    make_sandbox: Callable[..., PluginSandbox], tmp_path: Path, ledger: Ledger
) -> None:
    before = KVM_PATH.stat()
    fake = tmp_path / "null-as-kvm"
    os.mknod(fake, 0o020600, os.makedev(1, 3))
    sandbox = make_sandbox()
    sandbox.wait_http("/healthz", 20)
    sandbox.bind_mount(fake, KVM)
    assert _get(sandbox, "/stat?path=/dev/kvm")["rdev"] == [1, 3]
    assert sandbox.plugin_mounts().count(KVM) == 2  # the injected node and ours on top
    assert KVM not in mount_points("self"), "the host got the plugin's mount"
    after = KVM_PATH.stat()
    fields = ("st_rdev", "st_mode", "st_uid", "st_gid", "st_ino")
    assert [getattr(after, f) for f in fields] == [getattr(before, f) for f in fields]
    assert any(e.kind == "mount" and e.ident == KVM and e.detail == "plugin-ns"
               for e in read_entries([ledger.path]))  # fmt: skip
    sandbox.umount(KVM)
    assert _get(sandbox, "/stat?path=/dev/kvm")["rdev"] == [10, 232]
    assert _get(sandbox, "/kvm")["ok"] is True


def test_kill_leaves_no_process(make_sandbox: Callable[..., PluginSandbox], ledger: Ledger) -> None:
    sandbox = make_sandbox()
    sandbox.wait_http("/healthz", 20)
    pid = sandbox.pid
    # A helper left behind in the sandbox, as a probe worker would be: it must die with it.
    helper = sandbox.in_plugin_ns(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"])
    helper_pid = int(helper.stdout)
    assert sorted(sandbox.members()) == sorted([pid, helper_pid])
    assert sandbox.kill() == -signal.SIGKILL
    assert not alive(pid) and not alive(helper_pid)
    assert sandbox.members() == [] and sandbox.netns is not None
    assert sandbox.leftovers() == sandbox.netns.leftovers() != [], "only the pod network stays"
    assert [e for e in _leaks(ledger) if e.kind == "process"] == []


def test_restart_gives_a_new_pid_at_the_same_address(
    make_sandbox: Callable[..., PluginSandbox],
) -> None:
    sandbox = make_sandbox()
    sandbox.wait_http("/healthz", 20)
    first, addr = sandbox.pid, sandbox.health_addr
    second = sandbox.restart()
    assert second != first and not alive(first)
    assert sandbox.health_addr == addr
    sandbox.wait_http("/healthz", 20)
    assert sandbox.effective_caps()["CapBnd"] == 0


def test_close_leaves_nothing(tmp_path: Path, ledger: Ledger) -> None:
    sandbox = PluginSandbox(
        [sys.executable, "-c", PLUGIN, "8080", "t"], run_dir=tmp_path, ledger=ledger,
        index=worker_index(15), log_path=tmp_path / "plugin.log",
    )  # fmt: skip
    with sandbox:
        sandbox.wait_http("/healthz", 20)
        name = sandbox.netns_name
        assert name in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                      text=True, check=True).stdout  # fmt: skip
    assert sandbox.members() == [] and sandbox.leftovers() == []
    assert _leaks(ledger) == []
    kinds = {e.kind for e in read_entries([ledger.path])}
    assert {"process", "netns", "link"} <= kinds
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert name not in listed.stdout
    net = {p.name for p in Path("/sys/class/net").iterdir()}
    assert not net & {f"hvh{sandbox.index}", f"hvp{sandbox.index}"}
    sandbox.close()  # idempotent


def test_netns_index_in_use_leaves_the_owner_alone(ledger: Ledger) -> None:
    index = worker_index(14)
    with NetNamespace(f"hvt{index}-{os.getpid()}", index, ledger) as first:
        with pytest.raises(IndexInUseError, match=f"hvh{index} exists"):
            NetNamespace(f"hvt{index}b-{os.getpid()}", index, ledger)
        assert first.links_inside()[f"hvp{index}"] == [first.ns_addr]
        assert Path("/sys/class/net", first.host_link).exists()
        assert not Path("/run/netns", f"hvt{index}b-{os.getpid()}").exists()
    assert first.leftovers() == []
    assert _leaks(ledger) == []
