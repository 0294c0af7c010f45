"""Serve, then register; watch for a kubelet restart; serve again under a fresh name.

A fresh socket name per start and a fully restarted gRPC server avoid the kubelet bug where a
late disconnect of the old stream zeroes the new registration.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import socket
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2_grpc

from hv_device_plugin import metrics
from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.api import deviceplugin_pb2_grpc as pb_grpc
from hv_device_plugin.api.wire import API_VERSION, KUBELET_SOCKET
from hv_device_plugin.config import Config
from hv_device_plugin.endpoints import GrpcHealth
from hv_device_plugin.health import HealthState
from hv_device_plugin.logs import log, warn
from hv_device_plugin.server import DevicePluginServicer
from hv_device_plugin.shutdown import reap
from hv_device_plugin.watch import DirWatcher

# Restart detection polls this often while the plugin dir cannot be watched (missing, or not
# yet back); once watched, its events and mount-table changes drive it, and a poll every
# --recheck-interval is only a safety net (a once-a-second poll woke the process for nothing).
RESTART_POLL_S = 1.0
# After a predecessor's socket is removed, the device list is sent again now and this much later.
REASSERT_AGAIN_S = 1.0
# gRPC's own default, made explicit: a larger request is refused by gRPC (RESOURCE_EXHAUSTED)
# before it is read. The largest valid one (--slots IDs) is about 120 KiB.
MAX_REQUEST_BYTES = 4 * 1024 * 1024


async def _stop(
    server: grpc.aio.Server | None, socket: Path | None, inode: Identity | None, grace: float
) -> None:
    if server is not None:
        await server.stop(grace=grace)
    if socket is not None:
        _remove_own(socket, inode)


def _remove_own(socket: Path, inode: Identity | None) -> None:
    """grpcio removes its own socket on stop; this covers a server that never started. Only
    the inode we bound: a socket of the same name made since is not ours."""
    if _inode(socket) == inode:
        with contextlib.suppress(FileNotFoundError):
            socket.unlink()


STREAM_LOST = "ListAndWatch stream ended: the kubelet disconnected this endpoint"
OWN_SOCKET_REMOVED = "own socket removed"
KUBELET_RECREATED = "kubelet.sock re-created"
KUBELET_LISTENING = "kubelet.sock accepts connections again"
# Besides STREAM_LOST, each restart reason says a kubelet is (again) there to register with, even
# after the attempts gave up: its socket made again, ours removed (the kubelet's start-up cleanup
# deletes every socket in the dir), or the socket the last attempts could not reach now
# accepting (made between bind and listen).
# Codes of an attempt that never reached a kubelet (nothing listening, or no answer).
UNREACHED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _listening(path: Path) -> bool:
    """Something accepts connections on this unix socket now (a non-blocking connect)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            probe.connect(str(path))
        except BlockingIOError:  # backlog full: listening, and busy
            return True
        except OSError:
            return False
    return True


# A socket file's identity: device, inode and modification time. The inode number alone is not
# one: ext4 hands a freed inode to the next file made in the directory, so the kubelet's start-up
# cleanup (every socket deleted) followed by its new kubelet.sock gives that socket the number
# the old one had (measured here: the same st_ino, every time). A socket's mtime is set when it
# is bound and never changes after, so a socket made again differs in it.
Identity = tuple[int, int, int]


def _inode(path: Path) -> Identity | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


class Registrar:
    """Owns the gRPC server's lifetime and the registration with the kubelet."""

    def __init__(
        self,
        cfg: Config,
        health: HealthState,
        make_servicer: Callable[[], DevicePluginServicer],
    ) -> None:
        self._cfg = cfg
        self._health = health
        self._make_servicer = make_servicer
        self._server: grpc.aio.Server | None = None
        self._socket: Path | None = None
        self._socket_inode: Identity | None = None
        self._kubelet_inode: Identity | None = None
        self._gave_up_unreached = False  # the last round gave up without reaching a kubelet
        self._kick = asyncio.Event()
        self._watcher: DirWatcher | None = None
        self._reasserted_at = float("-inf")
        self._reassert_later: asyncio.TimerHandle | None = None
        self.registrations = 0
        # Each server gets a tag; the tag of the server the kubelet accepted (None: not
        # registered). Its streams are the kubelet's reading of that registration.
        self._server_tag = 0
        self._registered_tag: int | None = None
        self._streams_before = 0  # streams the registered server had before its Register
        health.add_stream_closed_listener(self._kick.set)
        self._retiring: set[asyncio.Task[None]] = set()  # servers being stopped
        self._retired: set[str] = set()  # socket names of this process's former servers

    @property
    def socket_path(self) -> Path | None:
        return self._socket

    def _own_socket_intact(self) -> bool:
        """Our socket is the file our server bound. No identity at all means it was removed
        between the bind and its reading (a kubelet's start-up cleanup racing our serve): gone
        too, not "unchanged" (a CI run's unit test: both attempts then dialled a deleted
        socket, and nothing after noticed)."""
        if self._socket is None or self._socket_inode is None:
            return False
        return _inode(self._socket) == self._socket_inode

    def _on_dir_event(self, _dir: Path, name: str) -> None:
        self._kick.set()
        if not self._predecessor_gone(name):
            return
        # Once now, once after the kubelet has surely seen that stream end as well; a burst of
        # events (create and delete of one socket, several instances) is one re-assertion.
        loop = asyncio.get_running_loop()
        if loop.time() - self._reasserted_at >= REASSERT_AGAIN_S:
            self._reasserted_at = loop.time()
            log("devices_reasserted", reason=f"another plugin socket removed: {name}")
            self._health.reassert()
        if self._reassert_later is not None:
            self._reassert_later.cancel()
        self._reassert_later = loop.call_later(REASSERT_AGAIN_S, self._health.reassert)

    def _predecessor_gone(self, name: str) -> bool:
        """A plugin socket other than ours and the kubelet's was just removed: an instance that
        stopped, perhaps after this one registered (a DaemonSet pod replaced, a rollout)."""
        return bool(
            self.registrations
            and name.endswith(".sock")
            and name != KUBELET_SOCKET
            and (self._socket is None or name != self._socket.name)
            and name not in self._retired
            and not (self._cfg.device_plugin_dir / name).exists()
        )

    def on_mount_change(self) -> None:
        """The plugin dir may now be another mount: watch it again and re-evaluate at once."""
        self._kick.set()
        if self._watcher is not None:
            self._watcher.rewatch()

    async def _serve(self) -> None:
        """A fresh server on a fresh socket name; while the plugin dir cannot hold a socket (it
        vanished, or another node agent replaces it), not registered, and retried on the dir's
        next event or the fallback poll: never a crash, the dir usually comes back."""
        # Streams on the old server belong to a kubelet that is gone: no grace for them.
        self._retire(grace=0.0)
        failing = ""
        while True:
            name = f"{self._cfg.socket_prefix}-{secrets.token_hex(4)}.sock"
            path = self._cfg.device_plugin_dir / name
            opts = [("grpc.max_receive_message_length", MAX_REQUEST_BYTES)]
            server = grpc.aio.server(options=opts)
            self._server_tag += 1
            self._health.forget_servers_but(self._server_tag)
            self._make_servicer().add_to_server(server, self._server_tag)
            health_pb2_grpc.add_HealthServicer_to_server(GrpcHealth(self._health), server)
            try:
                # grpcio says RuntimeError when it cannot bind (no dir, not a dir, no access)
                server.add_insecure_port(f"unix:{path}")
                await server.start()
            except RuntimeError as exc:
                await server.stop(grace=None)
                if str(exc) != failing:
                    failing = str(exc)
                    warn("serve_failed", socket=str(path), error=failing)
                self._health.set_registered(False, f"cannot serve at {path}: {failing}")
                await self._wait_kick(RESTART_POLL_S)
                continue
            break
        self._server, self._socket, self._socket_inode = server, path, _inode(path)
        log("serving", socket=str(path))

    def _retire(self, grace: float) -> None:
        """Stop the current server in the background. Not awaited before the next one serves
        and registers: stopping a server with a live stream took 2-3 ms, a third of the
        re-registration after a kubelet restart, and its socket name is never reused."""
        server, socket, inode = self._server, self._socket, self._socket_inode
        self._server = self._socket = None
        if socket is not None:
            self._retired.add(socket.name)  # its removal is not a predecessor going
        if server is not None or socket is not None:
            task = asyncio.ensure_future(_stop(server, socket, inode, grace))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _stop_server(self, grace: float = 0.5) -> None:
        """Stop the current server and wait for every retired one to be gone."""
        self._retire(grace)
        while self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)

    async def _register_once(self) -> None:
        assert self._socket is not None
        target = f"unix:{self._cfg.device_plugin_dir / KUBELET_SOCKET}"
        # A private subchannel per attempt: the global pool would hand back a subchannel still
        # in reconnect backoff from the failed attempt and fail fast for up to a second.
        options = [("grpc.use_local_subchannel_pool", 1)]
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            stub = pb_grpc.RegistrationStub(channel)
            await stub.Register(
                pb.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self._socket.name,
                    resource_name=self._cfg.resource_name,
                    options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=self._cfg.register_attempt_timeout_s,
                # Fail fast: a missing kubelet is retried on its socket's creation event.
                wait_for_ready=False,
            )

    async def _wait_kick(self, within_s: float) -> bool:
        try:
            async with asyncio.timeout(within_s):
                await self._kick.wait()
        except TimeoutError:
            return False
        self._kick.clear()
        return True

    async def _register_with_backoff(self) -> bool:
        backoff = self._cfg.register_backoff_initial_s
        last = ""
        unreached = False
        self._gave_up_unreached = False
        for attempt in range(1, self._cfg.register_attempts + 1):
            if not self._own_socket_intact():
                await self._serve()  # removed under us (kubelet start-up cleanup): serve again
            self._kubelet_inode = _inode(self._cfg.device_plugin_dir / KUBELET_SOCKET)
            # Streams opened from now on answer this Register: only their end is a loss.
            self._streams_before = self._health.server_streams(self._server_tag)[1]
            try:
                await self._register_once()
            except grpc.aio.AioRpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
                unreached = exc.code() in UNREACHED
                metrics.REGISTRATIONS.labels(result="failed").inc()
                warn("register_failed", attempt=attempt, error=last, socket=str(self._socket))
                self._health.set_registered(False, f"attempt {attempt} failed: {last}")
                # Full jitter: many plugins restarting with one kubelet must not stampede it.
                kicked = await self._wait_kick(random.uniform(backoff / 2, backoff))  # noqa: S311 - jitter, not crypto
                # A kick is news (kubelet.sock made, the dir changed): the backoff starts over.
                # kubelet.sock's creation event fires at bind(2), before the kubelet's
                # listen(2): an attempt it triggers may be refused, and the backoff grown by
                # the attempts the cleanup's events triggered just before left a real kubelet
                # v1.37.2 restart unanswered for 3.6 s.
                backoff = (
                    self._cfg.register_backoff_initial_s
                    if kicked
                    else min(backoff * 2, self._cfg.register_backoff_max_s)
                )
                continue
            self.registrations += 1
            self._registered_tag = self._server_tag  # the server that is serving: the current one
            metrics.REGISTRATIONS.labels(result="ok").inc()
            log(
                "registered",
                attempt=attempt,
                socket=str(self._socket),
                resource=self._cfg.resource_name,
            )
            self._health.set_registered(True, "")
            return True
        warn("register_gave_up", attempts=self._cfg.register_attempts, error=last)
        # A burst of the kubelet's start-up events (its cleanup deleting every socket, then
        # its socket's bind before its listen) can spend every attempt in milliseconds, the
        # last one recording the new kubelet.sock: only its accepting says the kubelet is there
        # (a CI run's graceful restart, measured: 8 attempts in 24 ms, never registered again).
        self._gave_up_unreached = unreached
        self._health.set_registered(
            False,
            f"gave up after {self._cfg.register_attempts} attempts ({last}); "
            "waiting for kubelet.sock to change",
        )
        return False

    def _stream_lost(self) -> bool:
        """Every ListAndWatch stream the kubelet opened on the registered server has ended.

        The kubelet then reads nothing more from this endpoint: when the stream ends (either
        side, a broken connection too) client.go `Run` returns and handler.go `runClient`
        disconnects it, marking every device unhealthy; only a new Register brings them back
        (v1.37.2 pkg/kubelet/cm/devicemanager/plugin/v1beta1). Streams of servers this process
        retired (a kubelet may still open one as it goes) are not this registration's.

        Only while the kubelet we registered with still listens: a stream also ends when the
        kubelet stops, and registering then would race its start-up cleanup (which deletes the
        socket just served, and the kubelet's dial of it hangs); its restart is seen as such."""
        tag = self._registered_tag
        if tag is None:
            return False
        open_now, ever = self._health.server_streams(tag)
        kubelet = self._cfg.device_plugin_dir / KUBELET_SOCKET
        # The kubelet opens exactly one stream per registration: only when that one (and no
        # other client's: a bench, a debugging tool) came and went is the endpoint lost.
        return (
            ever - self._streams_before == 1
            and open_now == 0
            and not self._health.shutting_down
            and _inode(kubelet) == self._kubelet_inode
            and _listening(kubelet)
        )

    def _restart_needed(self) -> str:
        if not self._own_socket_intact():
            return OWN_SOCKET_REMOVED
        kubelet = _inode(self._cfg.device_plugin_dir / KUBELET_SOCKET)
        if kubelet is not None and kubelet != self._kubelet_inode:
            return KUBELET_RECREATED
        if self._gave_up_unreached and _listening(self._cfg.device_plugin_dir / KUBELET_SOCKET):
            return KUBELET_LISTENING
        if self._stream_lost():
            return STREAM_LOST
        return ""

    async def _wait_restart_needed(self) -> str:
        while not (reason := self._restart_needed()):
            watched = self._watcher is not None and self._watcher.watching
            await self._wait_kick(self._cfg.recheck_interval_s if watched else RESTART_POLL_S)
        return reason

    async def run(self) -> None:
        self._watcher = DirWatcher(
            [self._cfg.device_plugin_dir], self._on_dir_event, RESTART_POLL_S
        )
        watch_task = asyncio.ensure_future(self._watcher.run())
        try:
            await self._serve()
            registered = await self._register_with_backoff()
            while True:
                reason = await self._wait_restart_needed()
                log("restart_detected", reason=reason, registered=registered)
                self._registered_tag = None  # the server about to go: its streams are not lost
                if registered:
                    self._health.set_registered(False, f"re-registering: {reason}")
                if reason == STREAM_LOST:
                    # The server and its socket are fine: register them again, as they are (a
                    # new socket would cut every other client of this one, and leave churn).
                    registered = await self._register_with_backoff()
                    continue
                await self._serve()
                # Every other reason is news of a kubelet, worth a new round of attempts even
                # after giving up. Our socket removed is such news: a kubelet crashed while its
                # stream ended looked like a lost stream, the attempts ran out before it came
                # back (8 of them with the default backoff, about 10 s: a loaded CI machine's
                # kubelet took longer), and its cleanup removing our socket was the one event
                # left to see.
                registered = await self._register_with_backoff()
        finally:
            await reap(watch_task)
            await self._stop_server()

    async def stop(self) -> None:
        await self._stop_server()
