"""CDI recovery after deletion, corruption and staleness.

Injection -> byte-exact spec: harness-side inotify on the CDI dir stamps the plugin's rename of
its temp file onto the spec, then the bytes are confirmed. Injection -> next healthy snapshot: on
a ListAndWatch stream the harness holds, but only where health flipped at all; when the repair won
(no Unhealthy snapshot), that is counted instead of inventing a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable

from asyncinotify import Inotify, Mask

from hvconform.bench.harness import Bench
from hvconform.bench.procfs import Span
from hvconform.bench.report import SEED_CDI_RECOVERY_S, Figure, Target, figure
from hvconform.bench.streams import Stream, open_streams
from hvconform.bench.waits import BenchTimeout, Plan, poll_until

RECOVERY_S = 10.0  # per injection; the seed needed up to 32.2 s, we fail loudly far sooner
SEED_TEXT = "22.3-32.2 s incl. polling"
TARGETS = [Target("median", 50.0), Target("p95", 100.0)]

INJECTIONS: dict[str, tuple[Callable[[Bench], None], str]] = {
    "deletion": (Bench.delete_spec, "unlink of the spec"),
    "corruption": (
        Bench.corrupt_spec,
        "in-place truncate and write of the spec's first half (invalid JSON, a torn write)",
    ),
    "staleness": (
        lambda b: b.replace_spec(b.stale),
        "rename onto the spec of a valid but different spec (uid 65533) from a staging dir on "
        "the same tmpfs (one MOVED_TO, like another writer's atomic replace)",
    ),
}


class RenameLog:
    """Stamps every rename of the plugin's temp file onto the spec, as the harness sees it: a
    file of the CDI dir itself (any name but the spec's: plugins name temp files their own way)
    moved onto the spec."""

    def __init__(self, bench: Bench) -> None:
        self._inotify = Inotify()
        self._inotify.add_watch(bench.cdi_dir, Mask.MOVED_FROM | Mask.MOVED_TO)
        self._spec = bench.spec_name
        self.renames: list[float] = []
        self._cookies: set[int] = set()
        self._changed = asyncio.Event()

    async def run(self) -> None:
        async for event in self._inotify:
            stamp = time.monotonic()
            name = event.name.name if event.name is not None else ""
            if Mask.MOVED_FROM in event.mask and name != self._spec:
                self._cookies.add(event.cookie)
            # Only the plugin's own rename counts: the staleness injection arrives from the
            # (unwatched) staging dir, so its cookie was never seen here.
            elif (
                Mask.MOVED_TO in event.mask and name == self._spec and event.cookie in self._cookies
            ):
                self._cookies.discard(event.cookie)
                self.renames.append(stamp)
                old, self._changed = self._changed, asyncio.Event()
                old.set()

    async def wait(self, index: int, seconds: float, what: str) -> float:
        """Stamp of rename number `index` (0-based), waiting for it if needed."""
        end = time.monotonic() + seconds
        while len(self.renames) <= index:
            left = end - time.monotonic()
            if left <= 0:
                raise BenchTimeout(what, seconds, f"{len(self.renames)} renames so far")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._changed.wait()
        return self.renames[index]

    def close(self) -> None:
        self._inotify.close()


async def cdi_recovery(bench: Bench, plan: Plan) -> list[Figure]:
    """Three figure pairs: deletion, corruption, staleness."""
    (stream,) = await open_streams(bench.socket(), 1)
    renames = RenameLog(bench)
    pump = asyncio.ensure_future(renames.run())
    figures: list[Figure] = []
    try:
        for kind in INJECTIONS:
            figures += await _series(bench, plan, kind, stream, renames)
    finally:
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump
        renames.close()
        await stream.close()
    return figures


async def _series(
    bench: Bench, plan: Plan, kind: str, stream: Stream, renames: RenameLog
) -> list[Figure]:
    inject, how = INJECTIONS[kind]
    span = Span()
    spec_s: list[float] = []
    healthy_s: list[float] = []
    not_exact = 0
    for i in range(plan.warmup + plan.cdi_injections):
        what = f"{kind} injection {i}"
        await poll_until(
            lambda: bench.spec_bytes() == bench.desired and stream.latest() is True,
            RECOVERY_S,
            f"a desired spec and a Healthy stream before {what}",
        )
        mark = len(renames.renames)
        t0 = time.monotonic()
        inject(bench)
        while True:
            renamed = await renames.wait(mark, RECOVERY_S, f"the plugin's rename after {what}")
            mark += 1
            if bench.spec_bytes() == bench.desired:
                break
            not_exact += 1  # renamed, yet not the desired bytes: wait for the next repair
        # The pause is also the window in which an Unhealthy snapshot would have to show up.
        await asyncio.sleep(random.uniform(*plan.gap_s))  # noqa: S311 - jitter, not crypto
        flipped = stream.first(False, t0)
        back = None
        if flipped is not None:
            back = await stream.wait(True, flipped.t, RECOVERY_S, f"Healthy again after {what}")
        if i < plan.warmup:
            continue
        spec_s.append(renamed - t0)
        if back is not None:
            healthy_s.append(back - t0)
    n = plan.cdi_injections
    load = span.load()
    warm = f"{plan.warmup} warm-up injections dropped; 50-150 ms random pause between injections"
    spec = figure(
        f"cdi.{kind}.spec",
        f"CDI {kind} -> byte-exact spec",
        f"Injection = {how}; from just before the injecting syscall to the harness's inotify "
        "stamp of the plugin's temp-file rename onto the spec (MOVED_FROM/MOVED_TO cookie), "
        f"bytes then confirmed equal to the desired spec; {warm}.",
        "ms",
        spec_s,
        scale=1000.0,
        seed=SEED_CDI_RECOVERY_S[0] * 1000.0,
        seed_text=SEED_TEXT,
        targets=list(TARGETS),
        load=load,
    )
    if not_exact:
        spec.notes.append(f"{not_exact} renames left bytes other than the desired spec")
    healthy = figure(
        f"cdi.{kind}.healthy",
        f"CDI {kind} -> next healthy snapshot",
        "Same injections; from just before the injection to the first Healthy ListAndWatch "
        "snapshot after an Unhealthy one, on a stream the harness holds; counted only for "
        "injections whose health flipped within the pause after the repair.",
        "ms",
        healthy_s,
        scale=1000.0,
        seed=SEED_CDI_RECOVERY_S[0] * 1000.0,
        seed_text=SEED_TEXT,
        load=load,
    )
    healthy.notes.append(
        f"{len(healthy_s)} of {n} injections showed an Unhealthy snapshot"
        + (
            ": the repair won every time (health never flipped), so there is no time to report"
            if not healthy_s
            else ""
        )
    )
    return [spec, healthy]
