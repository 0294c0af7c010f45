"""The registration socket, kept: served again when it is removed or replaced while the driver runs.

The kubelet knows the driver by this socket alone. Its plugin watcher (v1.37.2
pkg/kubelet/pluginmanager/pluginwatcher) registers a plugin on the socket's create event and
deregisters it on the delete event; a deregistered driver is called no more, and the kubelet
wipes its ResourceSlices. A socket removed under a running driver (a hand cleaning the dir, a
tool resetting it) would leave a driver that runs and answers its endpoint but is never used
again, and the pods asking for the device would stay unschedulable with nothing in its logs.

So the path is checked every CHECK_S: its lstat identity (device, inode, change time: inode
numbers are reused) against the socket this driver bound. When they differ the driver marks
itself unregistered (the kubelet has deregistered it: readiness drops until the kubelet's
NotifyRegistrationStatus) and serves a new registration socket at the path; the kubelet's create
event registers it again, and the slice is republished on that registration (daemon._follow).
A socket found at the path is taken for a stale one of this driver (the path carries the
driver's name, as at start) and replaced; anything else is never touched: it is logged once
and the path checked again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from pathlib import Path

import grpc

from hv_device_plugin.api import pluginregistration_pb2_grpc as reg_grpc
from hv_device_plugin.dra.service import RegistrationServicer
from hv_device_plugin.logs import log, warn

CHECK_S = 1.0  # well inside the kubelet's wipe delay: re-registered before the slice goes
LOST = "registration socket removed"

# st_dev, st_ino, st_ctime_ns, is a socket. The inode alone is not an identity: a file system
# hands a freed inode number to the next file made (tmpfs does at once), and a socket made in
# its place would pass for this driver's; its change time tells them apart.
_Identity = tuple[int, int, int, bool]


def remove_own_socket(path: Path) -> None:
    """A socket this driver left (a crash): removed; anything else at the path is refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise RuntimeError(f"{path} exists and is not a socket: refusing to replace it")
    path.unlink()


def _identity(path: Path) -> _Identity | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns, stat.S_ISSOCK(st.st_mode)


def _describe(found: _Identity | None) -> str:
    if found is None:
        return "nothing"
    return "another socket" if found[3] else "not a socket"


class Registrar:
    """Serves RegistrationServicer on `path` and serves it again when the socket goes."""

    def __init__(
        self, path: Path, servicer: RegistrationServicer, check_s: float = CHECK_S
    ) -> None:
        self.path, self.servicer, self.check_s = path, servicer, check_s
        self._server: grpc.aio.Server | None = None
        self._bound: _Identity | None = None  # the socket this driver serves, None when none
        self._warned = ""  # what was last warned about, so a lasting state is logged once
        self._closing = False
        self.checks = 0  # checks done (what a test waits on)

    async def start(self) -> None:
        """At start: a socket an earlier run left is replaced; anything else refuses the start
        (RuntimeError), as for the endpoint."""
        remove_own_socket(self.path)
        await self._serve()

    async def _serve(self) -> None:
        server = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(self.servicer, server)
        server.add_insecure_port(f"unix:{self.path}")  # binds: the socket exists from here
        bound = _identity(self.path)
        await server.start()
        self._server, self._bound = server, bound

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.check_s)  # the pacing of a periodic check
            await self.check()
            self.checks += 1

    async def check(self) -> None:
        if self._closing:
            return
        found = _identity(self.path)
        if found is not None and found == self._bound:
            return
        if self._bound is not None:
            self._bound = None
            warn("registration_socket_lost", path=str(self.path), found=_describe(found))
            self.servicer.lost(LOST)
        if found is not None and not found[3]:
            self._warn_once("registration_socket_obstructed", "not a socket: left in place")
            return
        try:
            await self._replace()
        except (OSError, RuntimeError) as exc:  # a bind refused, a file appeared meanwhile
            self._warn_once("registration_socket_recreate_failed", str(exc)[:300])
            return
        self._warned = ""
        log("registration_socket_recreated", path=str(self.path), replaced=_describe(found))

    def _warn_once(self, event: str, reason: str) -> None:
        if self._warned != event:
            self._warned = event
            warn(event, path=str(self.path), reason=reason, retry_s=self.check_s)

    async def _replace(self) -> None:
        old, self._server = self._server, None
        if old is not None:
            # Before the new bind, never after: a gRPC server that stops unlinks whatever
            # socket is at its path, which would be the new one.
            await old.stop(None)
        remove_own_socket(self.path)
        await self._serve()

    def unlink(self) -> None:
        """First at shutdown: the socket goes, so the kubelet deregisters the driver before its
        endpoint stops answering; only the socket this driver bound, and no check after."""
        self._closing = True
        if self._bound is not None and _identity(self.path) == self._bound:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
