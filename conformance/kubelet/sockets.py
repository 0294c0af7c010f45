"""The kubelet's files in the plugin directory: start-up cleanup, kubelet.sock and its service."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api import deviceplugin_pb2_grpc as pb_grpc

from .validation import CHECKPOINT_NAME, KUBELET_SOCKET_NAME

_SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes including the NUL


def cleanup_plugin_dir(plugin_dir: Path) -> list[str]:
    """Delete every socket in the dir, as the device manager does on start; returns names.

    Keeps the checkpoint, directories and other files. stat() follows symlinks like Go's
    os.Stat, so a link to a socket is removed too. A stale kubelet.sock of any non-directory
    type is removed so the new listener can take the name.
    """
    removed: list[str] = []
    for path in sorted(plugin_dir.iterdir()):
        name = path.name
        if name == CHECKPOINT_NAME:
            continue
        try:
            mode = path.stat().st_mode
        except OSError:
            if name == KUBELET_SOCKET_NAME and path.is_symlink():
                path.unlink()
                removed.append(name)
            continue
        if stat.S_ISSOCK(mode) or (name == KUBELET_SOCKET_NAME and not stat.S_ISDIR(mode)):
            path.unlink()
            removed.append(name)
    return removed


class RegistrationServicer(pb_grpc.RegistrationServicer):
    """The Registration service on kubelet.sock; `handle` returns the error text or None."""

    def __init__(self, handle: Callable[[pb.RegisterRequest], Awaitable[str | None]]) -> None:
        self._handle = handle

    async def Register(
        self,
        request: pb.RegisterRequest,
        context: grpc.aio.ServicerContext[pb.RegisterRequest, pb.Empty],
    ) -> pb.Empty:
        error = await self._handle(request)
        if error is not None:
            # A Go handler returning a plain error reaches the client as UNKNOWN + its text.
            await context.abort(grpc.StatusCode.UNKNOWN, error)
        return pb.Empty()


class KubeletSocket:
    """A grpc.aio server on kubelet.sock whose stop can look graceful or like a crash.

    gRPC unlinks its socket file when it stops, which would make every stop look graceful.
    So gRPC binds in a private directory next to the plugin dir and kubelet.sock is a hard
    link to that socket inode: stopping gRPC then removes only the private name, and a crash
    leaves kubelet.sock behind without any event in the plugin dir. When a hard link is not
    possible (other filesystem, path too long), gRPC binds kubelet.sock directly and a crash
    re-creates a socket node nobody listens on.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.server: grpc.aio.Server | None = None
        self._private: Path | None = None

    @property
    def hard_linked(self) -> bool:
        return self._private is not None

    async def start(self, add_servicers: Callable[[grpc.aio.Server], None]) -> None:
        """Listen; kubelet.sock appears (one create event) once the server accepts calls."""
        private = self._make_private_dir()
        if private is not None:
            server = await self._serve(add_servicers, private / KUBELET_SOCKET_NAME)
            try:
                os.link(private / KUBELET_SOCKET_NAME, self.path)
            except OSError:
                await server.stop(None)
                shutil.rmtree(private, ignore_errors=True)
                private = None
            else:
                self.server, self._private = server, private
                return
        self.server = await self._serve(add_servicers, self.path)

    async def stop(self, graceful: bool) -> None:
        """Stop serving; graceful removes kubelet.sock, a crash leaves it in place."""
        server, self.server = self.server, None
        if graceful:
            self.path.unlink(missing_ok=True)
        if server is not None:
            await server.stop(None)
        if not graceful and self._private is None and not self.path.exists():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.bind(str(self.path))
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
            self._private = None

    @staticmethod
    async def _serve(
        add_servicers: Callable[[grpc.aio.Server], None], path: Path
    ) -> grpc.aio.Server:
        server = grpc.aio.server()
        add_servicers(server)
        server.add_insecure_port(f"unix:{path}")
        await server.start()
        return server

    def _make_private_dir(self) -> Path | None:
        parent = self.path.parent.parent
        try:
            private = Path(tempfile.mkdtemp(prefix=".kubelet-emulator-", dir=parent))
        except OSError:
            return None
        same_fs = private.stat().st_dev == self.path.parent.stat().st_dev
        if not same_fs or len(os.fsencode(private / KUBELET_SOCKET_NAME)) > _SUN_PATH_MAX:
            private.rmdir()
            return None
        return private
