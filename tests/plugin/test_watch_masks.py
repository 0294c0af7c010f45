"""DirWatcher on real inotify: writes into files are events only in the directories whose
contents matter (the CDI dir). In a /dev they are not: a write to /dev/null is an IN_MODIFY on
the directory, and on a busy node that woke the plugin many times a second for nothing.

inotify delivers a watch's events in order, so "the first event is the marker's" proves that
the write before the marker produced none."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from hv_device_plugin.watch import DirWatcher

DEADLINE_S = 5.0


async def _first_events(dirs: list[Path], contents: list[Path], act: list[Path]) -> list[str]:
    seen: list[str] = []
    got = asyncio.Event()

    def on_event(where: Path, name: str) -> None:
        seen.append(f"{where.name}/{name}")
        got.set()

    watcher = DirWatcher(dirs, on_event, poll_interval_s=60.0, contents=contents)
    task = asyncio.ensure_future(watcher.run())
    try:
        # One step of the task: run() adds its watches synchronously before its first await.
        await asyncio.sleep(0)
        assert not task.done(), task
        for target in act:
            if target.name == "marker":
                target.touch()  # a new entry: an event in any watched directory
            else:
                with target.open("ab") as f:
                    f.write(b"x")
        try:
            async with asyncio.timeout(DEADLINE_S):
                await got.wait()
        except TimeoutError:
            raise AssertionError(f"no inotify event within {DEADLINE_S} s") from None
        return seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_writes_into_files_are_events_only_where_contents_matter(tmp_path: Path) -> None:
    dev, cdi = tmp_path / "dev", tmp_path / "cdi"
    for d in (dev, cdi):
        d.mkdir()
    (dev / "null").write_bytes(b"")
    (cdi / "spec.json").write_bytes(b"{}")

    first = asyncio.run(_first_events([dev], [], [dev / "null", dev / "marker"]))
    assert first[0] == "dev/marker", f"a write into a /dev entry woke the watcher: {first}"

    first = asyncio.run(_first_events([cdi], [cdi], [cdi / "spec.json", cdi / "marker"]))
    assert first[0] == "cdi/spec.json", f"a write into the spec was not an event: {first}"
