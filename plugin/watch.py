"""Change notification: inotify on directories and the mount table, with a polling fallback.

Watchers only say "something may have changed"; callers re-check the real state. That keeps
every decision on fresh lstat/open results and makes a missed or spurious event harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from asyncinotify import Inotify, Mask

from hv_device_plugin.logs import log, warn

# Entries appearing, going, renamed or re-permissioned, and the directory itself going.
_ENTRY_MASK = (
    Mask.CREATE
    | Mask.DELETE
    | Mask.MOVED_FROM
    | Mask.MOVED_TO
    | Mask.ATTRIB
    | Mask.DELETE_SELF
    | Mask.MOVE_SELF
    | Mask.ONLYDIR
)
# Writes into files too: only for directories whose files' contents matter (the CDI dir). Never
# for a /dev: every write to /dev/null or a tty there is an IN_MODIFY on the directory, which
# woke the plugin for nothing many times a second on a busy node.
_CONTENT_MASK = _ENTRY_MASK | Mask.CLOSE_WRITE | Mask.MODIFY
# After these the watch is gone (or points at a replaced inode): watch the path again.
_REWATCH = Mask.IGNORED | Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.UNMOUNT


class MountTableWatcher:
    """Calls back when this process's mount table changes (a remount, a bind mount, an unmount).

    A read-only remount or a mount over a watched directory fires no inotify event; the kernel
    signals mount-table changes as POLLPRI on /proc/self/mountinfo instead.
    """

    def __init__(self, on_change: Callable[[], None]) -> None:
        self._on_change = on_change
        self.changes = 0  # seen by the thread, each then reported through on_change
        self._mountinfo: int | None = None  # the thread's fd, for pending()
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="mount-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def pending(self) -> bool:
        """A mount-table change the thread has not read yet (POLLPRI stays raised until it
        re-reads the table): asked without waiting, from any thread."""
        fd = self._mountinfo
        if fd is None:
            return False
        poller = select.poll()
        poller.register(fd, select.POLLPRI)
        try:
            return bool(poller.poll(0))
        except OSError:  # closed meanwhile: the thread is gone
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        self._thread.join(timeout=5)
        for fd in (self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _run(self) -> None:
        try:
            mountinfo = open("/proc/self/mountinfo", "rb")  # noqa: SIM115 - lives with the thread
        except OSError as exc:
            warn("mount_watch_unavailable", error=str(exc))
            return
        with mountinfo:
            self._mountinfo = mountinfo.fileno()
            poller = select.poll()
            poller.register(mountinfo.fileno(), select.POLLPRI | select.POLLERR)
            poller.register(self._stop_r, select.POLLIN)
            mountinfo.read()
            while True:
                for fd, _ in poller.poll():
                    if fd == self._stop_r:
                        return
                    mountinfo.seek(0)
                    mountinfo.read()
                    self.changes += 1
                    self._on_change()


class DirWatcher:
    """Watches directories with inotify and calls back on any event in them.

    Directories that cannot be watched (missing, not yet mounted) are retried on every
    `rewatch()` and every poll interval, and the callback fires on each poll meanwhile, so a
    caller always gets at least a polling fallback.
    """

    def __init__(
        self,
        dirs: Sequence[Path],
        on_event: Callable[[Path, str], None],
        poll_interval_s: float,
        contents: Collection[Path] = (),
    ) -> None:
        """`contents`: the dirs among `dirs` where writes into files are events too."""
        self._dirs = list(dirs)
        self._contents = set(contents)
        self._on_event = on_event
        self._poll_interval_s = poll_interval_s
        self._rewatch = asyncio.Event()
        self._inotify: Inotify | None = None  # while watching
        self.watching = False  # every dir has its watch (no polling fallback)

    def rewatch(self) -> None:
        """Drop and re-add every watch (the mount table changed under a watched path)."""
        self._rewatch.set()

    def drain(self) -> None:
        """Call back now for every event already queued. A change made before this call has
        its event queued already (inotify queues within the system call that made it), so a
        caller that drains first (an Allocate) sees every change that happened before it
        arrived, whatever order the event loop would have run things in. Also the pump's reader
        callback: all reading happens here, so no event sits read but not yet dispatched."""
        inotify = self._inotify
        while inotify is not None:
            try:
                event = inotify.sync_get()
            except BlockingIOError:  # the queue is empty (the fd is non-blocking)
                return
            if event is None:
                return
            base = Path(event.watch.path) if event.watch is not None else Path("/")
            self._on_event(base, event.name.name if event.name else "")
            if event.mask & _REWATCH:
                log("watch_lost", path=str(base), mask=str(event.mask))
                self._rewatch.set()  # the rest belongs to the watch set being replaced
                return

    async def run(self) -> None:
        while True:
            self._rewatch.clear()
            with Inotify() as inotify:
                missing = []
                for d in self._dirs:
                    try:
                        mask = _CONTENT_MASK if d in self._contents else _ENTRY_MASK
                        inotify.add_watch(d, mask | Mask.DONT_FOLLOW)
                    except OSError as exc:
                        missing.append(str(d))
                        warn("watch_unavailable", path=str(d), error=str(exc), fallback="poll")
                if missing:
                    # Fire once so callers re-check now; then keep polling until watchable.
                    for d in self._dirs:
                        self._on_event(d, "")
                self.watching = not missing
                try:
                    await self._pump(inotify, poll=bool(missing))
                finally:
                    self.watching = False

    async def _pump(self, inotify: Inotify, poll: bool) -> None:
        """Dispatch events as they come until a rewatch (or, polling, the poll interval)."""
        loop = asyncio.get_running_loop()
        os.set_blocking(inotify.fd, False)  # drain() reads until EAGAIN, never waits
        self._inotify = inotify
        loop.add_reader(inotify.fd, self.drain)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_interval_s if poll else None):
                    await self._rewatch.wait()
        finally:
            loop.remove_reader(inotify.fd)
            self._inotify = None
