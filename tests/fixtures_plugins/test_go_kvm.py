"""The go-kvm fixture plugin, built from source and run for real: correct variant and defects.

Each test starts the binary in a private mount namespace (fixed paths bound to temp dirs) against
the kubelet stub, then talks to it over its socket as the kubelet and a health prober would.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from hv_device_plugin.config import parse_config
from hvconform.contract.plugin import load_profile
from tests.fixture_plugins import GO_KVM_DIR, build_go_kvm
from tests.fixtures_plugins.harness import (
    FixturePlugin,
    Stream,
    all_health,
    nsenter_mount,
    rss_kib,
    wait_in_dir,
)
from tests.plugin.kubelet_stub import KubeletStub

pytestmark = [pytest.mark.root, pytest.mark.kvm]

SPEC_NAME = "example.org-hypervisor.json"
CDI_DEVICE = "example.org/hypervisor=kvm"
IDS = [f"kvm-{i}" for i in range(4)]


def spec_bytes(uid: int = 65534, gid: int = 65534) -> bytes:
    """What the fixture promises to write (README): this document, indent 2, one newline."""
    node = {"path": "/dev/kvm", "type": "c", "permissions": "rw", "uid": uid, "gid": gid}
    doc = {
        "cdiVersion": "0.6.0",
        "kind": "example.org/hypervisor",
        "devices": [{"name": "kvm", "containerEdits": {"deviceNodes": [node]}}],
    }
    return (json.dumps(doc, indent=2) + "\n").encode()


def names(directory: Path) -> list[str]:
    return sorted(entry.name for entry in directory.iterdir())


def spec_ok(path: Path, want: bytes) -> bool:
    try:
        st = path.lstat()
        return path.is_file() and (st.st_mode & 0o7777) == 0o644 and path.read_bytes() == want
    except OSError:
        return False


@pytest.fixture(scope="module")
def binary() -> Path:
    return build_go_kvm()


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gkv-", dir="/tmp"))  # short: socket paths <= 107 bytes
    yield path
    shutil.rmtree(path)


@pytest.fixture
def kubelet(root: Path) -> Iterator[KubeletStub]:
    stub = KubeletStub(root / "device-plugins")
    stub.start()
    yield stub
    stub.stop()


Start = Callable[..., FixturePlugin]


@pytest.fixture
def start(binary: Path, root: Path, kubelet: KubeletStub) -> Iterator[Start]:
    """Start the plugin and wait for its first registration; teardown checks a clean stop."""
    started: list[FixturePlugin] = []

    def run(
        env: dict[str, str] | None = None, dev_override: str = "", argv: tuple[str, ...] = ("-v=2",)
    ) -> FixturePlugin:
        p = FixturePlugin(binary, root, kubelet, env=env, dev_override=dev_override, argv=argv)
        started.append(p)
        try:
            reg = kubelet.wait_registrations(1, 20)[0]
        except TimeoutError as exc:
            raise AssertionError(f"no registration; plugin log:\n{p.log()}") from exc
        assert reg.serving, f"registered before serving: {reg.error}"
        return p

    yield run
    for p in started:
        code = p.stop()
        assert code == 0, f"plugin exited {code}; log:\n{p.log()[-4000:]}"
        left = list((root / "device-plugins").glob("example-kvm-*.sock"))
        assert not left, f"plugin left sockets behind: {left}"


def test_registers_writes_spec_and_allocates_cdi(start: Start, kubelet: KubeletStub) -> None:
    p = start()
    reg = kubelet.registrations[0]
    assert (reg.version, reg.resource_name) == ("v1beta1", "example.org/kvm")
    assert reg.endpoint.startswith("example-kvm-") and reg.endpoint.endswith(".sock")
    assert spec_ok(p.cdi_dir / SPEC_NAME, spec_bytes())
    assert names(p.cdi_dir) == [SPEC_NAME], "temp files must not be left behind"
    stream = Stream(p.socket())
    try:
        stream.wait(lambda d: d == [(i, "Healthy") for i in IDS], 10, "4 healthy devices")
        p.wait_health("", "SERVING", 10)  # registered + stream open + device ok + spec ok
        assert p.health("liveness") == "SERVING"
        resp = p.allocate("kvm-1", "kvm-3")
        assert len(resp.container_responses) == 1
        answer = resp.container_responses[0]
        assert [d.name for d in answer.cdi_devices] == [CDI_DEVICE]
        assert not answer.devices and not answer.envs and not answer.mounts
        with pytest.raises(grpc.RpcError) as err:
            p.allocate("kvm-9")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        print(f"go-kvm VmRSS {rss_kib(p.proc.pid)} KiB")
    finally:
        stream.close()


def test_devices_flag_sets_the_advertised_ids(start: Start) -> None:
    p = start(argv=("-v=2", "-devices=2000"))
    stream = Stream(p.socket())
    try:
        want = [(f"kvm-{i}", "Healthy") for i in range(2000)]
        stream.wait(lambda d: sorted(d) == sorted(want), 10, "2000 healthy devices")
        assert len(p.allocate("kvm-1999").container_responses) == 1
        for unknown in ("kvm-2000", "kvm-01", "kvm--1", "kvm-"):
            with pytest.raises(grpc.RpcError) as err:
                p.allocate(unknown)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, unknown
    finally:
        stream.close()


def test_bench_profile_advertises_as_many_ids_as_our_default() -> None:
    """bench --versus compares like for like only if both send device lists of one size."""
    profile = load_profile(GO_KVM_DIR / "profile-bench.yaml")
    (flag,) = [a for a in profile.command if a.startswith("-devices=")]
    assert int(flag.removeprefix("-devices=")) == parse_config([]).slots


def test_spec_repaired_after_delete_corrupt_and_chmod(start: Start) -> None:
    p = start()
    spec, want = p.cdi_dir / SPEC_NAME, spec_bytes()
    spec.unlink()
    began = time.monotonic()
    wait_in_dir(p.cdi_dir, lambda: spec_ok(spec, want), 10, "spec re-created after delete")
    print(f"spec repaired {1000 * (time.monotonic() - began):.1f} ms after delete")
    spec.write_bytes(b'{"cdiVersion": "0.6.0", "kind": "broken"')
    wait_in_dir(p.cdi_dir, lambda: spec_ok(spec, want), 10, "malformed spec repaired")
    spec.chmod(0o600)
    wait_in_dir(p.cdi_dir, lambda: spec_ok(spec, want), 10, "spec mode repaired")
    assert names(p.cdi_dir) == [SPEC_NAME]


def make_obstruction(path: Path, kind: str) -> Callable[[], bool]:
    """Put a non-regular file at path; return a check that it is still there, untouched."""
    if kind == "directory":
        path.mkdir()
        return lambda: path.is_dir() and not path.is_symlink() and not any(path.iterdir())
    if kind == "symlink":
        target = path.parent.parent / "elsewhere.json"  # outside the CDI dir
        target.write_bytes(b"not mine")
        path.symlink_to(target)
        return lambda: path.is_symlink() and target.read_bytes() == b"not mine"
    os.mkfifo(path)
    return lambda: stat.S_ISFIFO(path.lstat().st_mode)


@pytest.mark.parametrize("kind", ["directory", "symlink", "fifo"])
def test_obstruction_left_alone_then_recovered(start: Start, root: Path, kind: str) -> None:
    (root / "cdi").mkdir()
    obstruction = root / "cdi" / SPEC_NAME
    untouched = make_obstruction(obstruction, kind)
    p = start()
    stream = Stream(p.socket())
    try:
        stream.wait(all_health("Unhealthy"), 10, f"unhealthy while a {kind} obstructs")
        with pytest.raises(grpc.RpcError) as err:
            p.allocate("kvm-0")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert p.health("") == "NOT_SERVING"
        assert untouched(), f"the {kind} at the spec path was touched"
        if kind == "directory":
            obstruction.rmdir()
        else:
            obstruction.unlink()
        stream.wait(all_health("Healthy"), 10, "healthy once the obstruction is gone")
        assert spec_ok(obstruction, spec_bytes())
    finally:
        stream.close()


def test_unusable_device_refused_then_recovered(start: Start) -> None:
    # /dev/null bound over /dev/kvm: a character device, but no KVM ioctls.
    p = start(dev_override="/dev/null")
    stream = Stream(p.socket())
    try:
        stream.wait(all_health("Unhealthy"), 10, "unhealthy with /dev/null as /dev/kvm")
        with pytest.raises(grpc.RpcError) as err:
            p.allocate("kvm-0")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "KVM_GET_API_VERSION" in str(err.value.details())
        nsenter_mount(p.proc.pid, "umount", "/dev/kvm")  # a mount-table event, no inotify one
        stream.wait(all_health("Healthy"), 10, "healthy once the real device is back")
        assert [d.name for d in p.allocate("kvm-0").container_responses[0].cdi_devices] == [
            CDI_DEVICE
        ]
    finally:
        stream.close()


def test_read_only_cdi_dir_refuses_then_recovers(start: Start) -> None:
    p = start()
    stream = Stream(p.socket())
    try:
        stream.wait(all_health("Healthy"), 10, "healthy at start")
        nsenter_mount(p.proc.pid, "mount", "-o", "remount,bind,ro", "/var/run/cdi")
        (p.cdi_dir / SPEC_NAME).unlink()  # through the host's writable view
        stream.wait(all_health("Unhealthy"), 10, "unhealthy: spec missing, dir read-only")
        with pytest.raises(grpc.RpcError) as err:
            p.allocate("kvm-0")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        nsenter_mount(p.proc.pid, "mount", "-o", "remount,bind,rw", "/var/run/cdi")
        stream.wait(all_health("Healthy"), 10, "healthy after the dir is writable again")
        assert spec_ok(p.cdi_dir / SPEC_NAME, spec_bytes())
    finally:
        stream.close()


def settled(p: FixturePlugin) -> FixturePlugin:
    """Wait until the plugin itself counts as registered: the stub records a Register before
    its answer reaches the plugin, and a restart in between fails that first attempt."""
    stream = Stream(p.socket())  # the kubelet opens ListAndWatch right after Register
    try:
        p.wait_health("", "SERVING", 10)
    finally:
        stream.close()
    return p


def test_reregisters_on_new_socket_after_kubelet_restart(
    start: Start, kubelet: KubeletStub
) -> None:
    p = settled(start())
    names, took = [kubelet.registrations[0].endpoint], []
    for _ in range(2):
        began = kubelet.restart()
        reg = kubelet.wait_serving_after(began, 20)
        names.append(reg.endpoint)
        took.append(reg.at - began)
    assert len(set(names)) == 3, f"a fresh socket name per start: {names}"
    assert max(took) < 2.0, f"re-registration too slow: {took}"
    print(f"re-registered after kubelet restart in {[round(t * 1000, 1) for t in took]} ms")
    assert p.socket().is_socket()


def test_sigterm_sends_empty_list_and_removes_socket(start: Start) -> None:
    p = start()
    sock = p.socket()
    stream = Stream(sock)
    stream.wait(all_health("Healthy"), 10, "healthy")
    assert p.stop() == 0
    stream.wait_ended(10)
    assert stream.snapshots[-1] == [], f"last snapshot must be empty: {stream.snapshots[-1]}"
    assert not sock.exists()


def test_custom_uid_gid_in_spec(start: Start) -> None:
    p = start(env={"GOKVM_DEVICE_UID": "1000", "GOKVM_DEVICE_GID": "2000"})
    assert spec_ok(p.cdi_dir / SPEC_NAME, spec_bytes(1000, 2000))


# --- Defects: each changes exactly what it names ---


def test_defect_no_cdi_repair_answers_without_repairing(start: Start) -> None:
    p = start(env={"GOKVM_DEFECT": "no-cdi-repair"})
    spec = p.cdi_dir / SPEC_NAME
    assert spec_ok(spec, spec_bytes()), "it still writes the spec once at start"
    spec.unlink()
    # The correct variant repairs before it answers; this one answers with no spec on disk.
    assert [d.name for d in p.allocate("kvm-0").container_responses[0].cdi_devices] == [CDI_DEVICE]
    assert not spec.exists()


def test_defect_no_probe_advertises_an_unusable_device(start: Start) -> None:
    p = start(env={"GOKVM_DEFECT": "no-probe"}, dev_override="/dev/null")
    stream = Stream(p.socket())
    try:
        stream.wait(all_health("Healthy"), 10, "healthy although /dev/kvm is /dev/null")
        assert p.allocate("kvm-0").container_responses[0].cdi_devices[0].name == CDI_DEVICE
    finally:
        stream.close()


def test_defect_no_health_serves_no_health_service(start: Start) -> None:
    p = start(env={"GOKVM_DEFECT": "no-health"})
    assert p.health("") == "UNIMPLEMENTED"
    assert p.health("liveness") == "UNIMPLEMENTED"
    assert p.allocate("kvm-0").container_responses[0].cdi_devices[0].name == CDI_DEVICE


def test_defect_slow_reregister_waits_five_seconds(start: Start, kubelet: KubeletStub) -> None:
    settled(start(env={"GOKVM_DEFECT": "slow-reregister"}))
    began = kubelet.restart()
    reg = kubelet.wait_serving_after(began, 20)
    # The plugin's 5 s timer starts when it sees the restart, a hair before `began` is taken.
    assert 4.5 <= reg.at - began < 10.0, f"re-registered after {reg.at - began:.2f}s"


@pytest.mark.parametrize("defect", ["", "stale-stream-after-restart"])
def test_defect_stale_stream_after_restart_loses_updates(
    start: Start, kubelet: KubeletStub, defect: str
) -> None:
    """Only the first stream ever served hears of health changes: after a kubelet restart the
    new stream keeps its opening snapshot (the correct variant sends the change there)."""
    p = settled(start(env={"GOKVM_DEFECT": defect} if defect else None))
    kubelet.wait_serving_after(kubelet.restart(), 20)
    stream = Stream(p.socket())  # the restarted kubelet's stream: not the first one
    spec = p.cdi_dir / SPEC_NAME
    try:
        stream.wait(all_health("Healthy"), 10, "healthy snapshot on the new stream")
        p.wait_health("", "SERVING", 10)
        # an obstruction: the plugin turns Unhealthy and unready. Its repair may write the spec
        # again between the unlink and the mkdir (a race seen in CI): retried, with a deadline
        deadline = time.monotonic() + 10
        while True:
            spec.unlink(missing_ok=True)
            try:
                spec.mkdir()
                break
            except FileExistsError:
                if time.monotonic() >= deadline:
                    raise
        p.wait_health("", "NOT_SERVING", 10)  # it noticed: the wake-ups are already sent
        if not defect:
            stream.wait(all_health("Unhealthy"), 10, "the change on the new stream")
        else:
            with pytest.raises(TimeoutError):
                stream.wait(all_health("Unhealthy"), 2, "the change on the new stream")
            assert stream.snapshots == [[(i, "Healthy") for i in IDS]], stream.snapshots
    finally:
        stream.close()
        if spec.is_dir() and not spec.is_symlink():
            spec.rmdir()


def probe(binary: Path, p: FixturePlugin, kind: str) -> subprocess.CompletedProcess[str]:
    """`go-kvm -probe=KIND` run as the kubelet's exec probe would: in the plugin's mount
    namespace, where its fixed paths are."""
    argv = ["nsenter", f"--mount=/proc/{p.proc.pid}/ns/mnt", str(binary), f"-probe={kind}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False)


def wait_probe(binary: Path, p: FixturePlugin, kind: str, code: int, timeout: float) -> str:
    """Run the probe until it exits `code` (a probe is a poll: the kubelet's period), with a
    deadline; its last line."""
    deadline = time.monotonic() + timeout
    while True:
        done = probe(binary, p, kind)
        if done.returncode == code:
            return done.stdout.strip()
        if time.monotonic() >= deadline:
            raise AssertionError(f"{kind} probe still exits {done.returncode}: {done.stdout}")
        time.sleep(0.2)  # the probe's own period, not a synchronisation


def test_exec_probes_follow_readiness_and_stay_live_during_a_fault(
    binary: Path, start: Start
) -> None:
    """The exec probes of deploy/daemonset-cluster-exec.yaml (a shell-less image, no HTTP
    port): readiness follows the plugin's own word, liveness stays true while the process runs,
    also while a fault makes it unready (else the kubelet would kill a plugin that repairs)."""
    p = settled(start())
    stream = Stream(p.socket())
    try:
        stream.wait(all_health("Healthy"), 10, "healthy at start")
        assert "SERVING on example-kvm-" in wait_probe(binary, p, "readiness", 0, 10)
        nsenter_mount(p.proc.pid, "mount", "-o", "remount,bind,ro", "/var/run/cdi")
        (p.cdi_dir / SPEC_NAME).unlink()  # spec missing, dir read-only: unready until repaired
        assert "not serving" in wait_probe(binary, p, "readiness", 1, 10)
        live = probe(binary, p, "liveness")
        assert live.returncode == 0, live.stdout
        nsenter_mount(p.proc.pid, "mount", "-o", "remount,bind,rw", "/var/run/cdi")
        wait_probe(binary, p, "readiness", 0, 10)
    finally:
        stream.close()


def test_exec_liveness_without_a_socket_asks_for_the_process(binary: Path, start: Start) -> None:
    p = settled(start())
    # The probe sees an empty plugin dir (a copy of the plugin's mount namespace with a tmpfs
    # there), as a replaced dir leaves it until the plugin serves again; the plugin's own view
    # is untouched (it would serve again at once).
    empty = 'mount -t tmpfs probe-view /var/lib/kubelet/device-plugins && exec "$0" -probe=liveness'
    argv = ["nsenter", f"--mount=/proc/{p.proc.pid}/ns/mnt", "unshare", "-m", "--propagation",
            "private", "sh", "-c", empty, str(binary)]  # fmt: skip
    live = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False)
    assert live.returncode == 0 and "the plugin process runs" in live.stdout, live.stdout
    bad = subprocess.run([str(binary), "-probe=startup"], capture_output=True, text=True)
    assert bad.returncode == 2 and "want readiness or liveness" in bad.stderr


def test_defect_never_back_after_stream_lost_stays_unregistered(
    binary: Path, root: Path, start: Start, kubelet: KubeletStub
) -> None:
    """Once the kubelet ends its stream the mutant never registers again, not even as a new
    process: the state a node it leaves so cannot be restored from (issue 35)."""
    defect = {"GOKVM_DEFECT": "never-back-after-stream-lost"}
    p = settled(start(env=defect))
    Stream(p.socket()).close()  # the kubelet ends the stream; kubelet.sock stays
    marker = p.cdi_dir / ".go-kvm-never-back"
    wait_in_dir(p.cdi_dir, marker.exists, 15, "the defect's marker")
    p.wait_health("", "NOT_SERVING", 10)
    assert p.stop() == 0
    again = FixturePlugin(binary, root, kubelet, env=defect)
    try:
        wait_in_dir(root, lambda: b"never registering again" in again.log_path.read_bytes(), 15,
                    "the restarted mutant's refusal")  # fmt: skip
        assert len(kubelet.registrations) == 1, kubelet.registrations
    finally:
        assert again.stop() == 0


def test_defect_dirty_obstruction_leaves_a_file_inside(start: Start, root: Path) -> None:
    obstruction = root / "cdi" / SPEC_NAME
    obstruction.mkdir(parents=True)
    start(env={"GOKVM_DEFECT": "dirty-obstruction"})
    wait_in_dir(obstruction, lambda: (obstruction / ".lock").exists(), 10, ".lock inside")
    with pytest.raises(OSError) as err:
        obstruction.rmdir()
    assert err.value.errno == errno.ENOTEMPTY


@pytest.mark.parametrize(
    ("env", "argv", "needle"),
    [
        ({"GOKVM_DEFECT": "no-probe,bogus"}, ("-v=2",), 'unknown GOKVM_DEFECT "bogus"'),
        ({"GOKVM_DEVICE_UID": "-1"}, ("-v=2",), "GOKVM_DEVICE_UID"),
        ({}, ("--root-prefix=/x",), "flag provided but not defined"),
        ({}, ("-v=2", "extra"), 'unexpected argument "extra"'),
        ({}, ("-devices=0",), "-devices=0: want 1 to 10000"),
        ({}, ("-devices=10001",), "-devices=10001: want 1 to 10000"),
    ],
)
def test_bad_input_exits_2_before_writing(
    binary: Path, root: Path, env: dict[str, str], argv: tuple[str, ...], needle: str
) -> None:
    kubelet = KubeletStub(root / "device-plugins")  # never started: nothing may dial it
    p = FixturePlugin(binary, root, kubelet, env=env, argv=argv)
    assert p.wait_exit(10) == 2
    p.stop()
    assert needle in p.log()
    assert not names(root / "cdi"), "bad input must be refused before anything is written"
    assert not names(root / "device-plugins")
