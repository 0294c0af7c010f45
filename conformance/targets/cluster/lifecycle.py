"""Running a cluster lifecycle: steps in order, cleanup armed before each, always run.

A Runbook executes the setup Steps of a plan. Before a step runs, the cleanup it arms is made due
(a half-finished `kind create` or `nodepool add` still needs its delete). Cleanup runs in reverse
arming order whatever happened: an exception, Ctrl-C, or SIGTERM (turned into an exception here,
so `finally` blocks run). While cleanup runs, both signals are held back and re-raised after it:
an impatient second Ctrl-C cannot leave a node pool behind. Verification follows cleanup and
goes into the report; a failed verification is an error, never silence.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from hvconform.targets.cluster.plan import Step

Action = Callable[[Step], None]


class Terminated(BaseException):
    """SIGTERM arrived; a BaseException so that nothing catches it by accident."""


class CleanupIncomplete(RuntimeError):
    """Cleanup or its verification failed: resources may be left behind (the report says which)."""


@dataclass
class StepRecord:
    id: str
    phase: str
    status: str  # ok, failed, skipped
    seconds: float
    error: str = ""


@dataclass
class RunReport:
    target: str
    contract: bool  # recorded stand-ins: never a live result
    steps: list[StepRecord] = field(default_factory=list)
    verification: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)

    @property
    def cleanup_ok(self) -> bool:
        failed = [s for s in self.steps if s.phase != "setup" and s.status == "failed"]
        return not failed and all(v.get("ok") for v in self.verification.values())

    def verify(self, name: str, ok: bool, detail: str = "") -> None:
        self.verification[name] = {"ok": bool(ok), "detail": detail}

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["cleanup_ok"] = self.cleanup_ok
        data["environment"] = {**self.environment, "contract": self.contract}
        return data

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(path)


class _Signals:
    """SIGTERM raises Terminated; during cleanup SIGINT and SIGTERM are held, then re-raised."""

    def __init__(self) -> None:
        self.held: int | None = None
        self.shielded = False
        self._saved: dict[int, Any] = {}

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.shielded:
            self.held = self.held or signum
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(f"signal {signum}")

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signal handlers can only be set from the main thread
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._saved[sig] = signal.signal(sig, self._handler)
        try:
            yield
        finally:
            for saved, old in self._saved.items():
                signal.signal(saved, old)

    def reraise_held(self) -> None:
        held, self.held = self.held, None
        if held == signal.SIGINT:
            raise KeyboardInterrupt
        if held is not None:
            raise Terminated(f"signal {held} (held during cleanup)")


# Long cluster steps (`az aks nodepool add`, `kind create cluster`) print nothing for minutes:
# every step says when it starts, every HEARTBEAT_S that it still runs, and how it ended.
HEARTBEAT_S = 30.0


@contextlib.contextmanager
def progress(what: str, out: Callable[[str], None] | None = None) -> Iterator[None]:
    def say(text: str) -> None:
        print(f"hvconform: {what}: {text}", file=sys.stderr, flush=True)

    emit = out or say
    t0 = time.monotonic()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            emit(f"still running ({time.monotonic() - t0:.0f} s)")

    emit("started")
    ticker = threading.Thread(target=beat, name=f"progress {what}", daemon=True)
    ticker.start()
    try:
        yield
    except BaseException:
        emit(f"failed after {time.monotonic() - t0:.1f} s")
        raise
    else:
        emit(f"done in {time.monotonic() - t0:.1f} s")
    finally:
        done.set()
        ticker.join()


class Runbook:
    """Executes one plan. `actions` maps step ids to code; a step with only argv just runs it."""

    def __init__(
        self,
        steps: list[Step],
        actions: dict[str, Action],
        report: RunReport,
        run_argv: Callable[[list[str]], object],
    ) -> None:
        self.steps = steps
        self.by_id = {s.id: s for s in steps}
        self.actions = actions
        self.report = report
        self.run_argv = run_argv
        self.armed: list[str] = []
        self.signals = _Signals()

    def _execute(self, step: Step) -> None:
        with progress(f"[{step.phase}] {step.id}"):
            action = self.actions.get(step.id)
            if action is not None:
                action(step)
            elif step.argv:
                self.run_argv(list(step.argv))
            else:
                raise RuntimeError(f"step {step.id} has neither an action nor a command")

    def _record(self, step: Step, t0: float, error: BaseException | None) -> None:
        text = "" if error is None else f"{type(error).__name__}: {error}"
        status = "ok" if error is None else "failed"
        self.report.steps.append(
            StepRecord(step.id, step.phase, status, round(time.monotonic() - t0, 3), text)
        )

    def setup(self) -> None:
        for step in (s for s in self.steps if s.phase == "setup"):
            if step.arms and step.arms not in self.armed:
                self.armed.append(step.arms)
            t0 = time.monotonic()
            try:
                self._execute(step)
            except BaseException as exc:
                self._record(step, t0, exc)
                raise
            self._record(step, t0, None)

    def cleanup(self) -> None:
        """Every armed cleanup step (reverse order), then every verification step; never raises
        for a step's failure (it is reported), so one failure cannot skip the rest."""
        self.signals.shielded = True
        try:
            due = [self.by_id[i] for i in reversed(self.armed)]
            due += [s for s in self.steps if s.phase == "verify"]
            for step in due:
                t0 = time.monotonic()
                try:
                    self._execute(step)
                except Exception as exc:
                    self._record(step, t0, exc)
                    self.report.notes.append(f"{step.id}: {traceback.format_exc(limit=3)}")
                else:
                    self._record(step, t0, None)
            self.armed.clear()
        finally:
            self.signals.shielded = False

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Setup on entry; cleanup and verification on exit, however the body ends."""
        with self.signals.installed():
            try:
                self.setup()
                yield
            finally:
                self.cleanup()
            self.signals.reraise_held()
