"""Long-lived probe helper process (`python -m hv_device_plugin.probe_worker`) and its asyncio client.

A device ioctl can block in the kernel, so identity and usability checks run in a helper that the
parent can SIGKILL at a deadline. Protocol, one JSON object per line:

    request  {"id": int, "kind": "kvm"|"mshv", "device_path": str, "host_view_path": str|null}
    response {"id": int, "ok": bool, "reason": str, "duration_s": float}

Test-only: with HV_PROBE_WORKER_TEST=1 in the helper's environment, kind "sleep" blocks for
float(device_path) seconds and then answers ok. `ProbeWorker` strips that variable from the
environment it passes on, so only its `env` argument can enable it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from hv_device_plugin.device import CheckResult, DeviceCheckError, DeviceKind, open_verified
from hv_device_plugin.probes.kvm import probe_kvm
from hv_device_plugin.probes.mshv import probe_mshv

# The helper runs this module as __main__ and only needs the code above; asyncio alone would
# more than double its start-up time, so only the parent side imports it.
if __name__ != "__main__" or TYPE_CHECKING:
    import asyncio

TEST_ENV = "HV_PROBE_WORKER_TEST"
SLEEP_KIND = "sleep"
DEFAULT_TIMEOUT_S = 2.0
# How long to wait for a SIGKILLed helper to be reaped (a task stuck in an uninterruptible
# ioctl cannot die); until it is, no new helper is started.
REAP_GRACE_S = 5.0
MAX_LINE_BYTES = 64 * 1024

PROBES: Mapping[str, Callable[[int, Callable[[int], None]], CheckResult]] = {
    DeviceKind.KVM.value: probe_kvm,
    DeviceKind.MSHV.value: probe_mshv,
}


# --- helper side -------------------------------------------------------------------------------


def run_request(
    request: Mapping[str, Any], test_mode: bool, release: Callable[[int], None] = os.close
) -> CheckResult:
    """Identity then usability for one request, on the very fd that passed identity.

    `release` gets the fd of the VM or partition the probe created."""
    started = time.monotonic()
    kind = request.get("kind")
    device_path = request.get("device_path")
    host_view_path = request.get("host_view_path")
    if kind == SLEEP_KIND and test_mode:
        time.sleep(float(str(device_path)))
        return CheckResult.passed(started)
    probe = PROBES.get(kind) if isinstance(kind, str) else None
    if probe is None:
        return CheckResult.failed(f"unknown probe kind {kind!r}", started)
    if not isinstance(device_path, str) or not isinstance(host_view_path, str | None):
        return CheckResult.failed("malformed request: bad device_path or host_view_path", started)
    try:
        fd = open_verified(device_path, host_view_path)
    except DeviceCheckError as exc:
        return CheckResult.failed(exc.reason, started)
    try:
        result = probe(fd, release)
    finally:
        os.close(fd)
    return CheckResult(result.ok, result.reason, time.monotonic() - started)


def serve(requests: IO[bytes], responses: IO[bytes], test_mode: bool) -> int:
    """Answer requests until end of input; one bad request never ends the loop.

    A probe's VM or partition is closed right after its answer is written, before the next
    request is read: destroying a VM costs the kernel more than creating it (0.6 vs 0.4 ms
    here), and the answer is already known once the ioctl succeeded.
    """
    created: list[int] = []
    while line := requests.readline():
        started = time.monotonic()
        request_id: object = None
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise TypeError("request is not a JSON object")
            request_id = request.get("id")
            result = run_request(request, test_mode, created.append)
        except Exception as exc:  # report, do not die: the parent would only respawn us
            result = CheckResult.failed(f"probe helper error: {type(exc).__name__}: {exc}", started)
        response = {
            "id": request_id,
            "ok": result.ok,
            "reason": result.reason,
            "duration_s": result.duration_s,
        }
        try:
            responses.write(json.dumps(response).encode() + b"\n")
            responses.flush()
        finally:
            while created:
                with contextlib.suppress(OSError):
                    os.close(created.pop())
    return 0


def main() -> int:
    """Helper entry point: the protocol on stdin and the original stdout."""
    # The parent owns our lifetime; a terminal's Ctrl-C is for it, not for us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Keep the protocol channel private: anything else printing to stdout lands on stderr.
    responses = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return serve(sys.stdin.buffer, responses, os.environ.get(TEST_ENV) == "1")


# --- parent side -------------------------------------------------------------------------------

_Key = tuple[str, str, str | None]


class HelperError(Exception):
    """The helper broke the protocol or died; `reason` is the one-line cause."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


def _excerpt(data: bytes, limit: int = 60) -> str:
    text = data.decode("utf-8", "replace").strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _is_alive(proc: asyncio.subprocess.Process) -> bool:
    """False once the helper has exited, even before the child watcher has reaped it."""
    if proc.returncode is not None:
        return False
    try:
        with open(f"/proc/{proc.pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


class ProbeWorker:
    """Runs device checks in one long-lived helper process, killed at each check's deadline.

    Rules: at most one helper alive; a helper that missed a deadline is SIGKILLed and reaped
    before another is spawned; concurrent callers with the same arguments share one check; a
    caller's cancellation neither cancels the shared check nor counts as a failure.
    """

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        argv: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`argv` replaces the helper command; `env` is added to the inherited environment."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self._timeout_s = timeout_s
        self._argv = list(argv) if argv else [sys.executable, "-m", "hv_device_plugin.probe_worker"]
        self._env = {k: v for k, v in os.environ.items() if k != TEST_ENV} | dict(env or {})
        self._lock = asyncio.Lock()
        self._proc: asyncio.subprocess.Process | None = None
        self._unreaped: asyncio.subprocess.Process | None = None
        self._inflight: dict[_Key, asyncio.Task[CheckResult]] = {}
        self._last: CheckResult | None = None
        self._next_id = 0
        self._closed = False

    @property
    def timeout_s(self) -> float:
        """The per-check deadline in seconds."""
        return self._timeout_s

    @property
    def last_result(self) -> CheckResult | None:
        """The most recently completed check, None before the first."""
        return self._last

    @property
    def in_flight(self) -> int:
        """Number of distinct checks currently running or queued."""
        return len(self._inflight)

    @property
    def helper_pid(self) -> int | None:
        """Pid of the current helper process, None when none is running."""
        return self._proc.pid if self._proc is not None else None

    async def check(
        self, kind: DeviceKind | str, device_path: str, host_view_path: str | None
    ) -> CheckResult:
        """Identity + usability of `device_path` in the helper, bounded by the deadline."""
        wire_kind = kind.value if isinstance(kind, DeviceKind) else kind
        key: _Key = (wire_kind, device_path, host_view_path)
        task = self._inflight.get(key)
        if task is None:
            if self._closed:
                return CheckResult(False, "probe worker is closed", 0.0)
            task = asyncio.get_running_loop().create_task(
                self._run(key), name=f"probe {wire_kind} {device_path}"
            )
            self._inflight[key] = task
            task.add_done_callback(functools.partial(self._forget, key))
        # The shield keeps a cancelled caller from cancelling the check the others share.
        return await asyncio.shield(task)

    async def __aenter__(self) -> ProbeWorker:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Spawn the helper now instead of at the first check: its interpreter start (tens of
        ms) then overlaps whatever the caller does next. The first check's request waits in the
        pipe until the helper reads it. A spawn that fails is retried by the first check."""
        async with self._lock:
            if not self._closed:
                with contextlib.suppress(OSError):
                    await self._ensure_helper()

    async def close(self) -> None:
        """Kill and reap the helper; later checks fail with "probe worker is closed"."""
        self._closed = True
        if self._proc is not None:
            self._kill(self._proc)
        pending = list(self._inflight.values())
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        async with self._lock:
            await self._discard_helper()

    def _forget(self, key: _Key, task: asyncio.Task[CheckResult]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]

    async def _run(self, key: _Key) -> CheckResult:
        async with self._lock:
            started = time.monotonic()
            try:
                result = await self._exchange(key, started)
            except BaseException:
                # Only loop shutdown cancels this task: leave no helper mid-request behind.
                if self._proc is not None:
                    self._kill(self._proc)
                raise
            self._last = result
            return result

    async def _exchange(self, key: _Key, started: float) -> CheckResult:
        if self._closed:
            return CheckResult.failed("probe worker is closed", started)
        if self._unreaped is not None:
            if _is_alive(self._unreaped):
                return CheckResult.failed(
                    f"previous probe helper (pid {self._unreaped.pid}) survived SIGKILL",
                    started,
                )
            self._unreaped = None
        try:
            proc = await self._ensure_helper()
        except OSError as exc:
            return CheckResult.failed(f"cannot start probe helper: {exc}", started)
        self._next_id += 1
        request_id = self._next_id
        kind, device_path, host_view_path = key
        request = {
            "id": request_id,
            "kind": kind,
            "device_path": device_path,
            "host_view_path": host_view_path,
        }
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        deadline -= time.monotonic() - started
        try:
            async with asyncio.timeout_at(deadline):
                line = await self._roundtrip(proc, json.dumps(request).encode() + b"\n")
            return self._parse(line, request_id, started)
        except TimeoutError:
            await self._discard_helper()
            return CheckResult.failed(f"probe deadline {float(self._timeout_s)}s exceeded", started)
        except HelperError as exc:
            await self._discard_helper()
            return CheckResult.failed(exc.reason, started)
        except (OSError, ValueError) as exc:
            # Broken pipe, reset, or a line over the limit: this helper's stream is unusable.
            await self._discard_helper()
            return CheckResult.failed(f"probe helper I/O failed: {exc}", started)

    async def _roundtrip(self, proc: asyncio.subprocess.Process, request: bytes) -> bytes:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(request)
        await proc.stdin.drain()
        line = await proc.stdout.readline()
        if not line:
            returncode = await proc.wait()
            raise HelperError(f"probe helper exited unexpectedly ({_describe_exit(returncode)})")
        return line

    def _parse(self, line: bytes, request_id: int, started: float) -> CheckResult:
        try:
            message = json.loads(line)
        except ValueError:
            raise HelperError(f"probe helper wrote an invalid response: {_excerpt(line)}") from None
        if (
            not isinstance(message, dict)
            or message.get("id") != request_id
            or not isinstance(message.get("ok"), bool)
            or not isinstance(message.get("reason"), str)
        ):
            raise HelperError(f"probe helper wrote an unexpected response: {_excerpt(line)}")
        if message["ok"]:
            return CheckResult.passed(started)
        return CheckResult.failed(message["reason"] or "probe failed without a reason", started)

    async def _ensure_helper(self) -> asyncio.subprocess.Process:
        if self._proc is not None:
            if _is_alive(self._proc):
                return self._proc
            await self._discard_helper()
        self._proc = await asyncio.create_subprocess_exec(
            *self._argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=self._env,
            limit=MAX_LINE_BYTES,
        )
        return self._proc

    @staticmethod
    def _kill(proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

    async def _discard_helper(self) -> None:
        """SIGKILL and reap the helper; no new helper is spawned until this returns."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self._kill(proc)
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            async with asyncio.timeout(REAP_GRACE_S):
                await proc.wait()
        except TimeoutError:
            self._unreaped = proc


if __name__ == "__main__":
    raise SystemExit(main())
