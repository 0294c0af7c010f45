"""Readers in other processes never see a partial CDI spec while it is broken and repaired."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hv_device_plugin.cdi import CdiReconciler, desired_spec

NAME = "hyperlight.json"
DESIRED = desired_spec(device_name="kvm", device_path="/dev/kvm")
STALE = desired_spec(device_name="kvm", device_path="/dev/kvm", uid=1000, gid=1000)
MIN_CYCLES = 1000
MIN_READS_PER_READER = 10_000
READERS = 2
DEADLINE_S = 120.0

# A separate interpreter per reader, so the GIL never serialises reads against the writer.
# Lines on stdout: "ready" after the first read, "quota" once enough reads were made, "torn"
# on the first read that is neither complete version; JSON counts after stdin closes.
READER = r"""
import json, os, select, sys
path, desired, stale, quota = sys.argv[1], open(sys.argv[2], "rb").read(), \
    open(sys.argv[3], "rb").read(), int(sys.argv[4])
counts = {"reads": 0, "desired": 0, "stale": 0, "torn": 0, "errors": 0}
samples = []
def say(word):
    sys.stdout.write(word + "\n")
    sys.stdout.flush()
while True:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        counts["errors"] += 1
        if len(samples) < 5:
            samples.append(repr(exc))
    else:
        kind = "desired" if data == desired else "stale" if data == stale else "torn"
        counts[kind] += 1
        if kind == "torn" and counts["torn"] == 1:
            say("torn")
    counts["reads"] += 1
    if counts["reads"] == 1:
        say("ready")
    if counts["reads"] == quota:
        say("quota")
    if counts["reads"] % 64 == 0 and select.select([0], [], [], 0)[0] and not os.read(0, 1):
        break
counts["samples"] = samples
say(json.dumps(counts))
"""


class Reader:
    """One reader process and the lines it has reported so far."""

    def __init__(self, path: Path, files: Path) -> None:
        argv = [sys.executable, "-c", READER, str(path)]
        argv += [str(files / "desired"), str(files / "stale"), str(MIN_READS_PER_READER)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        # Raw fd reads: a buffered reader would hide lines from select().
        self.fd = self.proc.stdout.fileno()
        self.buf = b""
        self.seen: list[str] = []

    def poll_lines(self, timeout: float) -> bool:
        """Collect whatever lines arrived within timeout; False once the reader has exited."""
        while select.select([self.fd], [], [], timeout)[0]:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return False
            self.buf += chunk
            *lines, self.buf = self.buf.split(b"\n")
            self.seen += [line.decode() for line in lines]
            timeout = 0
        return True

    def finish(self) -> dict[str, Any]:
        """Tell the reader to stop (stdin EOF) and return its final counts."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        deadline = time.monotonic() + 30
        while self.poll_lines(0.5):
            assert time.monotonic() < deadline, "reader did not stop"
        assert self.proc.wait(timeout=30) == 0
        counts: dict[str, Any] = json.loads(self.seen[-1])
        return counts


def wait_for(readers: list[Reader], word: str, deadline: float, step: Any = None) -> None:
    """Run step() (if any) until every reader has said word; fail at the deadline."""
    while not all(word in r.seen for r in readers):
        assert time.monotonic() < deadline, f"readers never reported {word!r}"
        if step is not None:
            step()
        for r in readers:
            assert r.poll_lines(0 if step is not None else 0.5), "reader exited early"


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[CdiReconciler, Path]]:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (tmp_path / "desired").write_bytes(DESIRED)
    (tmp_path / "stale").write_bytes(STALE)
    yield CdiReconciler(cdi, NAME, DESIRED), tmp_path


def inject_stale(path: Path) -> None:
    """What a fault injector does: replace the spec with stale bytes, atomically."""
    tmp = path.with_name(".inject.tmp")
    tmp.write_bytes(STALE)
    tmp.chmod(0o644)
    tmp.replace(path)


def test_readers_see_only_complete_files(setup: tuple[CdiReconciler, Path]) -> None:
    rec, files = setup
    assert rec.reconcile().repaired
    readers = [Reader(rec.path, files) for _ in range(READERS)]
    cycles = 0
    try:
        deadline = time.monotonic() + DEADLINE_S
        wait_for(readers, "ready", deadline)

        def cycle() -> None:
            nonlocal cycles
            inject_stale(rec.path)
            status = rec.reconcile()
            assert status.repaired and status.cause == "stale", status
            cycles += 1

        while cycles < MIN_CYCLES:
            cycle()
        wait_for(readers, "quota", deadline, cycle)
    finally:
        results = [r.finish() for r in readers]
    total = {k: sum(r[k] for r in results) for k in ("reads", "desired", "stale", "torn", "errors")}
    print(f"\nCDI atomicity: {cycles} stale/repair cycles, {READERS} reader processes: {total}")
    assert rec.path.read_bytes() == DESIRED
    assert total["errors"] == 0, [r["samples"] for r in results]
    assert total["torn"] == 0
    assert total["reads"] >= READERS * MIN_READS_PER_READER
    assert total["desired"] > 0 and total["stale"] > 0
    assert [p.name for p in rec.cdi_dir.iterdir()] == [NAME]


def test_readers_do_detect_a_non_atomic_writer(setup: tuple[CdiReconciler, Path]) -> None:
    """Sensitivity check: these readers do catch in-place rewrites, so zero above means much."""
    rec, files = setup
    rec.reconcile()
    readers = [Reader(rec.path, files)]
    try:
        deadline = time.monotonic() + DEADLINE_S
        wait_for(readers, "ready", deadline)

        def naive_write() -> None:
            with open(rec.path, "wb") as f:  # truncate, then write: visibly non-atomic
                f.write(STALE)
            with open(rec.path, "wb") as f:
                f.write(DESIRED)

        wait_for(readers, "torn", deadline, naive_write)
    finally:
        results = [r.finish() for r in readers]
    print(f"\nnon-atomic control: {results[0]}")
    assert results[0]["torn"] > 0
