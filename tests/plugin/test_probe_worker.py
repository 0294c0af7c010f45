"""ProbeWorker against real helper processes: deadlines, kills, single-flight, cancellation."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from hv_device_plugin.device import DeviceKind
from hv_device_plugin.probe_worker import TEST_ENV, ProbeWorker, serve

TEST_MODE = {TEST_ENV: "1"}
T = TypeVar("T")

needs_kvm = pytest.mark.skipif(
    not (Path("/dev/kvm").exists() and stat.S_ISCHR(os.lstat("/dev/kvm").st_mode)),
    reason="no /dev/kvm character device",
)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def gone(pid: int) -> bool:
    """True once `pid` is neither running nor a zombie: it was reaped."""
    return not Path(f"/proc/{pid}").exists()


def stat_fields(pid: int | str) -> list[bytes] | None:
    """Fields of /proc/<pid>/stat after the command name: state, ppid, ..."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def dead(pid: int) -> bool:
    """True once `pid` has exited (zombie or reaped)."""
    fields = stat_fields(pid)
    return fields is None or fields[0] in (b"Z", b"X")


def pid_of(worker: ProbeWorker) -> int:
    pid = worker.helper_pid
    assert pid is not None, "no helper running"
    return pid


def sleeping(pid: int) -> bool:
    """True once `pid` sleeps in nanosleep; True as well where the kernel hides wchan."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return True
    return wchan == "0" or "nanosleep" in wchan


def children() -> list[int]:
    """Pids whose parent is this process, zombies included."""
    me = str(os.getpid()).encode()
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and (fields := stat_fields(entry.name)) and fields[1] == me
    ]


async def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.002)


def fake_helper(body: str) -> list[str]:
    """A helper command that reads one request and then runs `body` (the argv seam)."""
    script = f"import json, sys\nrequest = json.loads(sys.stdin.readline())\n{body}\n"
    return [sys.executable, "-c", script]


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# --- helper side, in-process ------------------------------------------------------------------


def test_serve_answers_bad_requests_without_dying() -> None:
    lines = [b"not json\n", b"[1, 2]\n", json.dumps({"id": 7, "kind": "bogus"}).encode() + b"\n"]
    out = io.BytesIO()
    assert serve(io.BytesIO(b"".join(lines)), out, test_mode=False) == 0
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [a["id"] for a in answers] == [None, None, 7]
    assert not any(a["ok"] for a in answers)
    assert answers[0]["reason"].startswith("probe helper error: JSONDecodeError")
    assert answers[2]["reason"] == "unknown probe kind 'bogus'"


def test_helper_does_not_import_asyncio() -> None:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hv_device_plugin.probe_worker"],
        input=b"",
        capture_output=True,
        timeout=30,
        check=True,
    )
    imported = {line.split(b"|")[-1].strip() for line in proc.stderr.splitlines()}
    assert b"asyncio" not in imported
    assert b"hv_device_plugin.probes.kvm" in imported


# --- parent side ------------------------------------------------------------------------------


@needs_kvm
def test_kvm_check_passes_and_reuses_one_helper() -> None:
    async def scenario() -> None:
        worker = ProbeWorker()
        assert worker.last_result is None
        assert worker.helper_pid is None
        first = await worker.check(DeviceKind.KVM, "/dev/kvm", "/dev/kvm")
        assert first.ok, first.reason
        pid = pid_of(worker)
        second = await worker.check(DeviceKind.KVM, "/dev/kvm", None)
        assert second.ok and worker.helper_pid == pid
        assert worker.last_result is second
        await worker.close()
        assert worker.helper_pid is None and gone(pid)
        closed = await worker.check(DeviceKind.KVM, "/dev/kvm", None)
        assert closed.reason == "probe worker is closed"

    run(scenario())


@needs_root
def test_unusable_device_with_matching_identity_fails(tmp_path: Path) -> None:
    device, host = tmp_path / "dev-kvm", tmp_path / "host-kvm"
    for node in (device, host):
        os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(1, 3))

    async def scenario() -> None:
        async with ProbeWorker() as worker:
            kvm = await worker.check(DeviceKind.KVM, str(device), str(host))
            mshv = await worker.check(DeviceKind.MSHV, str(device), str(host))
            link = tmp_path / "link"
            link.symlink_to(device)
            refused = await worker.check(DeviceKind.KVM, str(link), str(host))
        assert kvm.reason == "KVM_GET_API_VERSION failed: Inappropriate ioctl for device (ENOTTY)"
        assert mshv.reason.startswith("MSHV_CREATE_PARTITION failed: ")
        assert refused.reason == f"{link} is not a character device (symlink)"

    run(scenario())


def test_sleep_kind_needs_the_constructor_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEST_ENV, "1")  # inherited: must not enable the test command

    async def scenario() -> None:
        async with ProbeWorker() as worker:
            result = await worker.check("sleep", "0", None)
        assert result.reason == "unknown probe kind 'sleep'"

    run(scenario())


def test_deadline_kills_and_reaps_before_respawn() -> None:
    timeout_s = 1.0

    async def scenario() -> None:
        async with ProbeWorker(timeout_s=timeout_s, env=TEST_MODE) as worker:
            assert (await worker.check("sleep", "0", None)).ok
            pid = pid_of(worker)
            started = time.monotonic()
            result = await worker.check("sleep", "60", None)
            elapsed = time.monotonic() - started
            assert result.reason == "probe deadline 1.0s exceeded"
            assert elapsed < timeout_s + 1.5
            assert gone(pid), "killed helper was not reaped before check() returned"
            assert worker.helper_pid is None
            assert worker.last_result is result
            again = await worker.check("sleep", "0", None)
            assert again.ok and worker.helper_pid not in (None, pid)

    run(scenario())


def test_at_most_one_helper_alive() -> None:
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, len(children()))
            stop.wait(0.0005)

    async def scenario() -> None:
        async with ProbeWorker(timeout_s=0.3, env=TEST_MODE) as worker:
            for _ in range(3):
                await asyncio.gather(
                    worker.check("sleep", "60", None),
                    worker.check("sleep", "0", None),
                    worker.check("sleep", "0.01", None),
                    worker.check(DeviceKind.KVM, "/dev/null", None),
                )

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        run(scenario())
    finally:
        stop.set()
        sampler.join()
    assert peak == 1
    assert children() == []


def test_concurrent_identical_checks_share_one_run() -> None:
    async def scenario() -> None:
        async with ProbeWorker(timeout_s=5.0, env=TEST_MODE) as worker:
            await worker.check("sleep", "0", None)
            started = time.monotonic()
            results = await asyncio.gather(*(worker.check("sleep", "0.3", None) for _ in range(16)))
            elapsed = time.monotonic() - started
        assert all(r is results[0] for r in results)
        assert results[0].ok
        assert elapsed < 0.3 * 3  # one run, not sixteen in a row

    run(scenario())


def test_cancelled_caller_neither_cancels_nor_fails_the_check() -> None:
    async def scenario() -> None:
        async with ProbeWorker(timeout_s=5.0, env=TEST_MODE) as worker:
            await worker.check("sleep", "0", None)
            pid = pid_of(worker)
            impatient = asyncio.create_task(worker.check("sleep", "0.3", None))
            await wait_until(lambda: worker.in_flight == 1)
            impatient.cancel()
            with pytest.raises(asyncio.CancelledError):
                await impatient
            assert worker.in_flight == 1, "the shared check was cancelled with its caller"
            shared = await worker.check("sleep", "0.3", None)  # joins the surviving run
            assert shared.ok and worker.last_result is shared
            assert worker.helper_pid == pid

            # The only caller cancelled: the check still completes and is recorded as ok.
            lonely = asyncio.create_task(worker.check("sleep", "0.2", None))
            await wait_until(lambda: worker.in_flight == 1)
            lonely.cancel()
            with pytest.raises(asyncio.CancelledError):
                await lonely
            await wait_until(lambda: worker.last_result is not shared)
            last = worker.last_result
            assert last is not None and last.ok, last
            assert worker.helper_pid == pid

    run(scenario())


def test_helper_killed_while_idle_is_replaced() -> None:
    async def scenario() -> None:
        async with ProbeWorker(env=TEST_MODE) as worker:
            assert (await worker.check("sleep", "0", None)).ok
            pid = pid_of(worker)
            os.kill(pid, signal.SIGKILL)
            await wait_until(lambda: dead(pid))
            result = await worker.check("sleep", "0", None)
            assert result.ok, result.reason
            assert worker.helper_pid not in (None, pid)
            assert gone(pid)

    run(scenario())


def test_helper_killed_mid_check_fails_then_recovers() -> None:
    async def scenario() -> None:
        async with ProbeWorker(timeout_s=30.0, env=TEST_MODE) as worker:
            assert (await worker.check("sleep", "0", None)).ok
            pid = pid_of(worker)
            task = asyncio.create_task(worker.check("sleep", "60", None))
            await wait_until(lambda: worker.in_flight == 1 and sleeping(pid))
            started = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            result = await task
            assert time.monotonic() - started < 5.0
            assert result.reason == "probe helper exited unexpectedly (killed by SIGKILL)"
            assert gone(pid)
            assert (await worker.check("sleep", "0", None)).ok

    run(scenario())


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("print('this is not json', flush=True)", "probe helper wrote an invalid response: "),
        ("sys.exit(3)", "probe helper exited unexpectedly (exit code 3)"),
        (
            "print(json.dumps({'id': request['id'] + 1, 'ok': True, 'reason': ''}), flush=True)",
            "probe helper wrote an unexpected response: ",
        ),
        ("print('x' * 200000, flush=True)", "probe helper I/O failed: "),
    ],
)
def test_misbehaving_helper_fails_and_is_respawned(body: str, reason: str) -> None:
    async def scenario() -> None:
        async with ProbeWorker(
            timeout_s=10.0, argv=fake_helper(body + "\nsys.stdin.read()")
        ) as worker:
            for _ in range(2):
                result = await worker.check(DeviceKind.KVM, "/dev/kvm", None)
                assert not result.ok
                assert result.reason.startswith(reason), result.reason
                assert "\n" not in result.reason
                assert worker.helper_pid is None
                assert children() == []

    run(scenario())


@needs_kvm
def test_start_spawns_the_helper_that_the_first_check_uses() -> None:
    """start() spawns before any check (the plugin does it before importing grpc); the first
    check's request waits in the pipe while the helper's interpreter starts."""

    async def scenario() -> None:
        worker = ProbeWorker()
        await worker.start()
        pid = pid_of(worker)
        await worker.start()  # idempotent: still one helper
        assert worker.helper_pid == pid
        result = await worker.check(DeviceKind.KVM, "/dev/kvm", None)
        assert result.ok, result.reason
        assert worker.helper_pid == pid, "the first check must use the helper start() spawned"
        await worker.close()
        assert gone(pid)
        await worker.start()  # closed: spawns nothing
        assert worker.helper_pid is None

    run(scenario())


def test_a_failed_start_is_retried_by_the_first_check() -> None:
    async def scenario() -> None:
        worker = ProbeWorker(argv=["/nonexistent/probe-helper"])
        await worker.start()  # no exception: the check reports the cause
        assert worker.helper_pid is None
        result = await worker.check(DeviceKind.KVM, "/dev/kvm", None)
        await worker.close()
        assert result.reason.startswith("cannot start probe helper: ")

    run(scenario())


def test_missing_helper_command_fails_with_reason() -> None:
    async def scenario() -> None:
        worker = ProbeWorker(argv=["/nonexistent/probe-helper"])
        result = await worker.check(DeviceKind.KVM, "/dev/kvm", None)
        await worker.close()
        assert result.reason.startswith("cannot start probe helper: ")

    run(scenario())


def test_close_kills_an_in_flight_check() -> None:
    async def scenario() -> None:
        worker = ProbeWorker(timeout_s=30.0, env=TEST_MODE)
        task = asyncio.create_task(worker.check("sleep", "60", None))
        await wait_until(lambda: worker.helper_pid is not None)
        pid = pid_of(worker)
        started = time.monotonic()
        await worker.close()
        assert time.monotonic() - started < 5.0
        result = await task
        assert not result.ok
        assert gone(pid) and children() == []

    run(scenario())


@needs_kvm
def test_warm_check_latency(capsys: pytest.CaptureFixture[str]) -> None:
    """Measured and printed, not asserted: the numbers depend on the machine."""

    async def measure(worker: ProbeWorker, concurrency: int, total: int = 512) -> list[float]:
        samples: list[float] = []

        async def caller() -> None:
            for _ in range(total // concurrency):
                started = time.perf_counter()
                result = await worker.check(DeviceKind.KVM, "/dev/kvm", "/dev/kvm")
                samples.append(time.perf_counter() - started)
                assert result.ok, result.reason

        await asyncio.gather(*(caller() for _ in range(concurrency)))
        return samples

    async def scenario() -> dict[int, list[float]]:
        async with ProbeWorker() as worker:
            await worker.check(DeviceKind.KVM, "/dev/kvm", "/dev/kvm")  # warm the helper
            return {concurrency: await measure(worker, concurrency) for concurrency in (1, 16)}

    with capsys.disabled():
        for concurrency, samples in run(scenario()).items():
            print(
                f"\nprobe latency concurrency={concurrency:2d} n={len(samples)} "
                f"p50={percentile(samples, 0.50) * 1e3:.2f}ms "
                f"p99={percentile(samples, 0.99) * 1e3:.2f}ms"
            )
