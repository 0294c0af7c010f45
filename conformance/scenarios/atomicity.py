"""Atomic replacement: readers during allocation-triggered repair see only whole files."""

from __future__ import annotations

import time

from hvconform.contract.node import CAP_READ_STORM, Node, require
from hvconform.contract.results import Recorder
from hvconform.scenarios.common import fresh_guest, require_spec, wait_ready, wait_spec_desired

CYCLES = 30


def atomic_replacement(node: Node, rec: Recorder) -> None:
    require(node, CAP_READ_STORM)
    require_spec(node)
    wait_ready(node, rec, "before storm")
    desired = node.baseline_spec
    stale = desired.replace(b"65534", b"65533") if b"65534" in desired else desired + b"\n"
    storm = node.start_read_storm("cdi", node.spec_name, [stale, desired])
    first_repairs = []
    try:
        for _ in range(CYCLES):
            t0 = time.monotonic()
            node.write_file("cdi", node.spec_name, stale)  # atomic (rename) injection
            allocation = node.allocate()  # must repair before it answers
            seen = time.monotonic()
            assert allocation.ok, f"allocation refused: {allocation.reason} {allocation.message}"
            node.release(allocation)
            first_repairs.append(wait_spec_desired(node, 10, "after allocation") - t0)
            rec.metric("allocate_answered_s", seen - t0)
    finally:
        stats = storm.stop()
    rec.event("storm stopped")
    rec.metric("reads", stats.reads)
    rec.metric("read_errors", stats.errors)
    rec.metric("torn_reads", stats.unexpected)
    rec.metric("cycles", CYCLES)
    rec.metric("first_repair_s", sorted(first_repairs)[len(first_repairs) // 2])
    rec.metric("first_repair_max_s", max(first_repairs))
    if stats.detail:
        rec.note(stats.detail)
    assert stats.reads > 0, "the readers read nothing"
    assert stats.errors == 0, f"{stats.errors} read errors during replacement"
    assert stats.unexpected == 0, f"{stats.unexpected} torn or foreign reads during replacement"
    fresh_guest(node, rec, "atomic replacement")
