"""Helpers shared by the kubelet emulator tests: runners, contexts, file probes."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import stat
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

from asyncinotify import Event, Inotify, Mask

from hvconform.kubelet import (
    KubeletEmulator,
)
from tests.conformance.minimal_plugin import MinimalPlugin

RES = "example.com/dev"
MINIMAL_PLUGIN = Path(__file__).with_name("minimal_plugin.py")


def run(coro: Coroutine[Any, Any, None], timeout: float = 60.0) -> None:
    """Run one async scenario with an overall deadline."""

    async def bounded() -> None:
        async with asyncio.timeout(timeout):
            await coro

    asyncio.run(bounded())


@contextlib.asynccontextmanager
async def kubelet(plugin_dir: Path, **kwargs: Any) -> AsyncIterator[KubeletEmulator]:
    emu = KubeletEmulator(plugin_dir, **kwargs)
    await emu.start()
    try:
        yield emu
    finally:
        await emu.stop()


@contextlib.asynccontextmanager
async def device_plugin(
    plugin_dir: Path, *, start: bool = True, **kwargs: Any
) -> AsyncIterator[MinimalPlugin]:
    plugin = MinimalPlugin(plugin_dir, **kwargs)
    if start:
        await plugin.start()
    try:
        yield plugin
    finally:
        await plugin.stop()


def bind_dead_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))


def names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


def file_mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def is_socket(path: Path) -> bool:
    return path.exists() and stat.S_ISSOCK(path.lstat().st_mode)


async def events_until(
    ino: Inotify, done: Callable[[Event], bool], within_s: float = 10.0
) -> list[tuple[str, Mask]]:
    """Collect inotify events up to and including the first for which done() holds."""
    seen: list[tuple[str, Mask]] = []
    async with asyncio.timeout(within_s):
        async for ev in ino:
            seen.append((str(ev.name), ev.mask))
            if done(ev):
                return seen
    raise AssertionError("inotify stream ended")
